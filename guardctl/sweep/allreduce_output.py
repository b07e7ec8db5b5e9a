"""Reading all-reduce results: nccl-tests' ``all_reduce_perf`` text and allreduce.py's JSON lines.

nccl-tests prints ``#`` header lines (parameters, one ``#  Rank ... device ...``
line per rank, the column titles), one data line per message size with the
out-of-place then in-place ``time algbw busbw #wrong`` columns, and trailers
``# Out of bounds values : N OK`` and ``# Avg bus bandwidth    : X``. Older
releases have no ``root`` column and print ``N/A`` for ``#wrong`` when checks
are off. The figure judged is the bus bandwidth at the largest messages (the
link's capacity); the average over all sizes is kept for the record.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

_RANK = re.compile(
    r"^#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+"
    r"\[[^\]]*\]\s+(.+?)\s*$"
)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
LARGEST = 3  # judge on the bus bandwidth of this many largest message sizes


@dataclass(frozen=True)
class Sample:
    """One message size: out-of-place figures (what nccl-tests' average uses)."""

    size: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int


@dataclass
class AllreduceRun:
    """What one all-reduce job measured."""

    backend: str
    samples: list[Sample] = field(default_factory=list)
    ranks: int = 0
    hosts: list[str] = field(default_factory=list)
    device: str = ""
    avg_busbw: float | None = None  # as the tool reported it
    wrong: int = 0
    complete: bool = False  # the final summary line was seen

    @property
    def busbw(self) -> float | None:
        """Bus bandwidth at the largest messages, GB/s (median of the largest sizes)."""
        if not self.samples:
            return None
        top = sorted(self.samples, key=lambda s: s.size)[-LARGEST:]
        return statistics.median(s.busbw for s in top)

    def detail(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "ranks": self.ranks,
            "hosts": self.hosts,
            "avg_busbw": self.avg_busbw,
            "sizes": len(self.samples),
            "max_size": max((s.size for s in self.samples), default=0),
        }


def parse(text: str) -> AllreduceRun | None:
    """Parse either format; None when *text* holds no all-reduce result at all."""
    if any(line.startswith("# nThread") for line in text.splitlines()):
        return parse_nccl_tests(text)
    return parse_json_lines(text)


def _number(token: str) -> float:
    return float(token)


def _wrong(token: str) -> int:
    return 0 if token == "N/A" else int(float(token))


def parse_nccl_tests(text: str) -> AllreduceRun | None:
    run = AllreduceRun(backend="nccl-tests")
    has_root = True
    hosts: dict[int, str] = {}
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith("#"):
            if m := _RANK.match(line):
                hosts[int(m.group(1))] = m.group(2)
                run.device = run.device or m.group(4)
            elif m := _AVG.match(line):
                run.avg_busbw = float(m.group(1))
                run.complete = True
            elif m := _OOB.match(line):
                run.wrong += int(m.group(1))
            elif "redop" in line and "size" in line:
                has_root = "root" in line.split()
            continue
        sample = _data_line(line.split(), has_root)
        if sample is not None:
            run.samples.append(sample)
            run.wrong += sample.wrong
    run.ranks = len(hosts)
    run.hosts = sorted(set(hosts.values()))
    return run if run.samples else None


def _data_line(tokens: list[str], has_root: bool) -> Sample | None:
    # size count type redop [root] time algbw busbw #wrong (out-of-place), then in-place
    first = 5 if has_root else 4
    if len(tokens) < first + 4 or not (tokens[0].isdigit() and tokens[1].isdigit()):
        return None
    try:
        time_us, algbw, busbw = (_number(t) for t in tokens[first : first + 3])
        wrong = _wrong(tokens[first + 3])
        if len(tokens) >= first + 8:  # the in-place result is checked too
            wrong += _wrong(tokens[first + 7])
    except ValueError:
        return None  # a line cut short by a killed job
    return Sample(int(tokens[0]), time_us, algbw, busbw, wrong)


def parse_json_lines(text: str) -> AllreduceRun | None:
    run: AllreduceRun | None = None
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # stderr noise in the job's output
        if not isinstance(rec, dict):
            continue
        kind = rec.get("kind")
        if kind == "allreduce_sample":
            run = run or AllreduceRun(backend="allreduce.py")
            try:
                run.samples.append(
                    Sample(
                        int(rec["size"]),
                        float(rec["time_us"]),
                        float(rec["algbw"]),
                        float(rec["busbw"]),
                        int(rec.get("wrong", 0)),
                    )
                )
            except (KeyError, TypeError, ValueError):
                continue
        elif kind == "allreduce_result" and run is not None:
            run.backend = str(rec.get("backend", run.backend))
            run.ranks = int(rec.get("ranks", 0))
            run.hosts = [str(n) for n in rec.get("nodes", [])]
            run.device = str(rec.get("device", ""))
            run.avg_busbw = float(rec["busbw_avg"]) if "busbw_avg" in rec else None
            run.complete = True
    if run is not None:
        run.wrong = sum(s.wrong for s in run.samples)
    return run
