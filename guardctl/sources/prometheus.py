"""Reading dcgm-exporter and node_exporter series from a Prometheus server into a Frame.

One ``/api/v1/query_range`` POST per exporter series (and per chunk: no query asks
for more than ``max_points`` steps), with a timeout, retries on what is transient
(a refused or reset connection, a timeout, HTTP 429/502/503/504), and a bearer token
or basic-auth credentials read from a file. The matrices become schema-v1 ``gpu`` and
``nic`` records, exactly what the agent writes, and go through the analyzer's own
parser (:func:`guardctl.analyze.frame.parse_lines`). A GPU series labelled with its job
(``source.job_label``, dcgm-exporter's ``hpc_job``) gives its records that job; with
``source.jobs_from = "slurm"`` a sample without the label takes the job Slurm ran on its
node at its time (:mod:`guardctl.sources.slurm_jobs`): the analyzer then compares the GPU
with the other GPUs of its job.

Anything short of a complete answer is an error, never a verdict: a server that is
down or too slow, an HTTP or API error, a body that is not Prometheus's JSON, and a
*partial* result (the API's ``warnings``) raise :class:`~guardctl.errors.SourceError`.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from guardctl.analyze.frame import Frame, parse_lines
from guardctl.errors import SourceError
from guardctl.nodes import validate_name
from guardctl.sections.source import SourceSettings
from guardctl.sources import dcgm_fields as F

if TYPE_CHECKING:
    from guardctl.sources.slurm_jobs import NodeJobs

RETRY_STATUS = frozenset({429, 502, 503, 504})
DEFAULT_NODE_LABELS = ("Hostname", "hostname", "instance")


@dataclass
class Coverage:
    """What the source gave: per schema field the series used, or why it is missing."""

    url: str
    given: dict[str, str] = field(default_factory=dict)  # "gpu.sm_clock_mhz" -> metric
    missing: dict[str, str] = field(default_factory=dict)  # "gpu.power_limit_w" -> why
    series: int = 0
    samples: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # series left out, per reason
    queries: int = 0
    jobs: dict[str, Any] = field(default_factory=dict)  # where the GPUs' jobs came from
    # The records of source.store_kinds read beside it: path, kinds, files, records ({}: none
    # asked for).
    store: dict[str, Any] = field(default_factory=dict)

    def store_warning(self) -> str | None:
        """One line when the store kinds were asked for and not one record was found: the
        signals only they carry (the ranks' busy time, host load) are then not judged."""
        if not self.store or self.store["records"]:
            return None
        kinds = "/".join(self.store["kinds"])
        return (
            f"no {kinds} records (source.store_kinds) in {self.store['path']} "
            f"({self.store['files']} files read): judged on Prometheus's series alone, "
            "without what only those records show; give --input the store or directory "
            "the agents and the probe write"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "prometheus",
            "url": self.url,
            "given": dict(sorted(self.given.items())),
            "missing": dict(sorted(self.missing.items())),
            "series": self.series,
            "samples": self.samples,
            "skipped": dict(sorted(self.skipped.items())),
            "queries": self.queries,
            "jobs": dict(self.jobs),
            "store": dict(self.store),
        }

    def summary(self) -> str:
        """One line for the human output."""
        gone = ", ".join(sorted(self.missing)) or "nothing"
        jobs = ""
        if self.jobs.get("from") == "slurm":
            jobs = (
                f"; jobs from Slurm: {self.jobs['jobs']} jobs, "
                f"{self.jobs['samples_with_job']} GPU samples with a job"
            )
        store = ""
        if self.store:
            store = (
                f"; from {self.store['path']}: {self.store['records']} "
                f"{'/'.join(self.store['kinds'])} records in {self.store['files']} files"
            )
        return (
            f"prometheus {self.url}: {self.series} series, {self.samples} samples in "
            f"{self.queries} queries; not given: {gone}{jobs}{store}"
        )


def _read_secret(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise SourceError(f"source.{what}: {path}: cannot read: {exc.strerror}") from None


class PrometheusClient:
    """Prometheus's HTTP query API over the standard library's urllib."""

    def __init__(self, url: str, cfg: SourceSettings, sleep: Callable[[float], None] = time.sleep):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise SourceError(f"{url!r}: not an http(s) URL of a Prometheus server")
        self.url = url.rstrip("/")
        self.cfg = cfg
        self.sleep = sleep
        self.queries = 0
        self.headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if cfg.bearer_token_file:
            token = _read_secret(cfg.bearer_token_file, "bearer_token_file")
            self.headers["Authorization"] = f"Bearer {token}"
        elif cfg.basic_auth_file:
            user_pass = _read_secret(cfg.basic_auth_file, "basic_auth_file")
            if ":" not in user_pass:
                raise SourceError("source.basic_auth_file: expected one 'user:password' line")
            encoded = base64.b64encode(user_pass.encode()).decode()
            self.headers["Authorization"] = f"Basic {encoded}"

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Any]:
        """The matrix of *expr* over [start, end] every *step* s, in chunks of max_points."""
        out: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        lo = start
        while lo <= end:
            hi = min(end, lo + step * (self.cfg.max_points - 1))
            form = {"query": expr, "start": _ts(lo), "end": _ts(hi), "step": _ts(step)}
            data = self.call("query_range", form)
            if data.get("resultType") != "matrix":
                raise SourceError(f"{self.url}: query_range answered a {data.get('resultType')}")
            for s in data.get("result", []):
                key = tuple(sorted(s.get("metric", {}).items()))
                have = out.setdefault(key, {"metric": s.get("metric", {}), "values": []})
                have["values"].extend(s.get("values", []))
            lo = hi + step
        return list(out.values())

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """An instant query's ``data`` (the dashboard test parses expressions this way)."""
        form = {"query": expr}
        if at is not None:
            form["time"] = _ts(at)
        return self.call("query", form)

    def call(self, endpoint: str, form: dict[str, str]) -> dict[str, Any]:
        """POST to ``/api/v1/<endpoint>``; the answer's ``data``, or SourceError."""
        body = urllib.parse.urlencode(form).encode()
        last = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                self.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            self.queries += 1
            try:
                return self._once(endpoint, body)
            except _Transient as exc:
                last = str(exc)
        tries = self.cfg.retries + 1
        raise SourceError(f"{self.url}: {last} ({tries} tries, {self.cfg.timeout_s:g} s each)")

    def _once(self, endpoint: str, body: bytes) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.url}/api/v1/{endpoint}", data=body, headers=self.headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code in RETRY_STATUS:
                raise _Transient(f"HTTP {exc.code} {exc.reason}") from None
            raise SourceError(f"{self.url}: {_api_error(exc.read(), f'HTTP {exc.code}')}") from None
        except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, a cut answer
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or "timed out" in str(reason):
                raise _Transient(f"no answer within {self.cfg.timeout_s:g} s") from None
            raise _Transient(f"cannot connect: {reason}") from None
        return self._data(raw)

    def _data(self, raw: bytes) -> dict[str, Any]:
        try:
            doc = json.loads(raw)
        except ValueError:
            raise SourceError(f"{self.url}: the answer is not Prometheus's JSON") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise SourceError(f"{self.url}: {_api_error(raw, 'query failed')}")
        if doc.get("warnings"):
            warn = "; ".join(map(str, doc["warnings"]))[:200]
            raise SourceError(f"{self.url}: partial result ({warn}): refusing to judge on it")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise SourceError(f"{self.url}: the answer has no data")
        return data


class _Transient(Exception):
    """A failure worth another try."""


def _api_error(raw: bytes, fallback: str) -> str:
    try:
        doc = json.loads(raw)
        return f"{doc.get('errorType', 'error')}: {str(doc.get('error', ''))[:200]}"
    except (ValueError, AttributeError):
        return fallback


def _ts(x: float) -> str:
    return f"{x:.3f}"


# --- matrices -> schema-v1 records ------------------------------------------------------------


class NodeNames:
    """The Slurm node name of a series: from its labels, through the configured mapping."""

    def __init__(self, cfg: SourceSettings) -> None:
        self.labels = (cfg.node_label,) if cfg.node_label else DEFAULT_NODE_LABELS
        self.mapping = dict(cfg.node_map)

    def __call__(self, labels: dict[str, str]) -> str | None:
        for key in self.labels:
            raw = labels.get(key)
            if raw:
                break
        else:
            return None
        if key == "instance" and raw not in self.mapping:
            raw = _host_of(raw)
        name = self.mapping.get(raw, raw)
        try:
            return validate_name(name)
        except Exception:  # a name Slurm could not have: not ours to judge
            return None


def _host_of(instance: str) -> str:
    """``node1:9400`` -> ``node1``; ``[::1]:9400`` -> ``::1``."""
    if instance.startswith("["):
        return instance[1:].partition("]")[0]
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() else instance


_UNIT_LABELS = {"gpu": "gpu", "nic": "device/port"}


def _unit(kind: str, labels: dict[str, str]) -> tuple[Any, ...] | None:
    """The GPU index or the NIC (device, port) a series is about."""
    try:
        if kind == "gpu":
            return (int(labels["gpu"]),)
        return (labels["device"], int(labels["port"]))
    except (KeyError, ValueError):
        return None


def fetch(
    client: PrometheusClient,
    cfg: SourceSettings,
    since: float,
    until: float,
    jobs: NodeJobs | None = None,
) -> tuple[Frame, Coverage]:
    """The exporter series over [since, until] as a frame, and what the source gave; *jobs*
    (Slurm's, for ``jobs_from = "slurm"``) names the job of each GPU sample without a label."""
    selector = "{" + cfg.selector + "}" if cfg.selector else ""

    def matrix(metric: str, stamps: bool = False) -> list[Any]:
        expr = f"timestamp({metric}{selector})" if stamps else metric + selector
        return client.query_range(expr, since, until, cfg.step_s)

    frame, cov = to_frame(matrix, cfg, client.url, jobs)
    cov.queries = client.queries
    return frame, cov


def to_frame(
    matrix: Callable[[str, bool], list[Any]],
    cfg: SourceSettings,
    url: str = "",
    jobs: NodeJobs | None = None,
) -> tuple[Frame, Coverage]:
    """Records from the matrix that *matrix(metric, False)* gives per exporter series.

    Fallback series are asked for only when the preferred one is absent. A query
    step finds the newest sample of the last 5 minutes (Prometheus's lookback), so
    a gap in scraping would repeat old values as if new: *matrix(metric, True)*,
    the sample times of each unit's first series, drops every step whose sample an
    earlier step already had, and a gap stays a gap (the analyzer's "unknown").
    """
    cov = Coverage(url, jobs={"from": cfg.jobs_from})
    names = NodeNames(cfg)
    job_label = cfg.job_label if cfg.jobs_from != "none" else ""
    # (kind, node, unit) -> field -> [per-series values]
    units: dict[tuple[Any, ...], dict[str, list[list[tuple[float, Any]]]]] = {}
    for kind, table in F.FIELDS.items():
        for name, options in table.items():
            used = []
            for series in options:
                found = matrix(series.metric, False)
                if not found:
                    continue
                used.append(series.metric)
                _collect(kind, name, series, found, names, units, cov, job_label)
                if series.how in ("value", "state", "xid"):
                    break  # a direct series found: the fallbacks are not needed
            key = f"{kind}.{name}"
            if used:
                cov.given[key] = "+".join(used)
            else:
                cov.missing[key] = "no " + " or ".join(s.metric for s in options)
    stale = _stale_steps(matrix, cfg, cov, names)
    lines = _lines(units, stale, jobs)
    if jobs is not None:
        cov.jobs.update(jobs.to_dict())
        if jobs.attributed:
            label = cov.given.get("gpu.job")
            cov.given["gpu.job"] = (label + ", else " if label else "") + "Slurm's jobs"
    return parse_lines(lines), cov


def _stale_steps(
    matrix: Callable[[str, bool], list[Any]], cfg: SourceSettings, cov: Coverage, names: NodeNames
) -> set[tuple[Any, ...]]:
    """(kind, node, *unit, step time) of steps that only repeat an older sample."""
    out: set[tuple[Any, ...]] = set()
    for kind, table in F.FIELDS.items():
        first = next((cov.given[f"{kind}.{n}"] for n in table if f"{kind}.{n}" in cov.given), None)
        if first is None:
            continue
        for s in matrix(first.split("+")[0], True):
            labels = s.get("metric", {})
            node, unit = names(labels), _unit(kind, labels)
            if node is None or unit is None:
                continue
            for t, sampled in map(_sample, s.get("values", [])):
                if t - sampled >= cfg.step_s:  # the previous step saw this sample already
                    out.add((kind, node, *unit, t))
    return out


def matrices(series: F.SeriesSet) -> dict[str, list[Any]]:
    """Series as :func:`guardctl.sources.dcgm_fields.exporter_series` gives them, as
    Prometheus's matrices per metric (what the benchmark feeds :func:`to_frame`)."""
    out: dict[str, list[Any]] = {}
    for (metric, labels), samples in series.items():
        out.setdefault(metric, []).append({"metric": dict(labels), "values": samples})
    return out


def _collect(
    kind: str,
    name: str,
    series: F.Series,
    matrix: list[Any],
    names: NodeNames,
    units: dict[tuple[Any, ...], dict[str, list[list[tuple[float, Any]]]]],
    cov: Coverage,
    job_label: str = "",
) -> None:
    for s in matrix:
        labels = s.get("metric", {})
        node = names(labels)
        unit = _unit(kind, labels)
        if node is None or unit is None:
            why = "no node name" if node is None else f"no {_UNIT_LABELS[kind]} label"
            cov.skipped[why] = cov.skipped.get(why, 0) + 1
            continue
        samples = sorted(_sample(v) for v in s.get("values", []))
        cov.series += 1
        cov.samples += len(samples)
        per = units.setdefault((kind, node, *unit), {})
        per.setdefault(name, []).append(F.field_values(series, samples))
        job = labels.get(job_label) if kind == "gpu" and job_label else None
        if job:
            per.setdefault("job", []).append([(t, job) for t, _ in samples])
            cov.given["gpu.job"] = f"{job_label} label"


def _sample(pair: Any) -> tuple[float, float]:
    try:
        return float(pair[0]), float(pair[1])  # Prometheus sends values as strings
    except (TypeError, ValueError, IndexError):
        return 0.0, math.nan


def _lines(
    units: dict[tuple[Any, ...], dict[str, list[list[tuple[float, Any]]]]],
    stale: set[tuple[Any, ...]],
    jobs: NodeJobs | None = None,
) -> list[bytes]:
    out = []
    for key, fields in units.items():
        kind, node = key[0], key[1]
        merged = {name: F.merge_fields(kind, name, vals) for name, vals in fields.items()}
        stamps = sorted({t for per in merged.values() for t in per})
        for t in stamps:
            if (*key, t) in stale:
                continue
            rec: dict[str, Any] = {"v": 1, "kind": kind, "ts": t, "node": node}
            if kind == "gpu":
                rec["gpu"] = key[2]
            else:
                rec["device"], rec["port"] = key[2], key[3]
            for name, per in merged.items():
                if t in per:
                    rec[name] = per[t]
            if kind == "gpu" and jobs is not None and not rec.get("job"):  # a label wins
                job = jobs.at(node, t)
                if job is not None:
                    rec["job"] = job
            out.append(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
    return out
