"""The agents' own health in the store: "collector broken" told apart from "no data".

Real agents (fake NVML at the import boundary, a recorded InfiniBand tree)
write a few minutes of a small fleet to a store; the analyzer and the
Prometheus export read it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_helpers import FakeNvml, settings
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from storetools import agent_records

from guardctl.agent.daemon import Agent
from guardctl.analyze import analyze
from guardctl.cli import main
from guardctl.config import Settings, load_settings
from guardctl.storage import store as shared_store

TS = 1_796_040_000.0  # 2026-11-30T12:00:00Z
INTERVAL = 5.0
SAMPLES = 36  # three 60 s windows
HEALTHY = [f"gpu0{i}" for i in range(1, 7)]


def _analysis_settings() -> Settings:
    return load_settings(assignments=["analyze.window_s=60", "analyze.cache=false"], environ={})


# What runs on a node at sample i: its agent (None: none any more) and whether the
# driver is gone for it (what the fake NVML answers that agent's nvmlInit).
Schedule = Callable[[int], tuple[Agent | None, bool]]


def _fleet(root: Path, fake: FakeNvml, extra: dict[str, Schedule]) -> None:
    """Six healthy nodes and the *extra* ones sample every 5 s for three minutes."""
    agents = [Agent(settings(), root, node) for node in HEALTHY]
    running: dict[str, Agent | None] = dict.fromkeys(extra)
    for i in range(SAMPLES):
        ts = TS + i * INTERVAL
        for agent in agents:
            agent.sample(ts)
        for node, schedule in extra.items():
            agent, no_driver = schedule(i)
            previous = running[node]
            if previous is not None and agent is not previous:
                previous.close()  # stopped or restarted
            running[node] = agent
            if agent is not None:
                fake.no_driver = no_driver
                agent.sample(ts)
                fake.no_driver = False
    for agent in [*agents, *running.values()]:
        if agent is not None:
            agent.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    fake_nvml = FakeNvml("h200_sxm_8gpu.json")
    with pytest.MonkeyPatch.context() as patch:  # at the import boundary, for this module
        patch.setitem(sys.modules, "pynvml", fake_nvml.module())
        yield _store(tmp_path_factory.mktemp("health") / "store", fake_nvml)


def _store(root: Path, fake_nvml: FakeNvml) -> Path:
    # The recorded node has one hot, throttling GPU; here every GPU is like GPU 0 (healthy).
    fake_nvml.gpus[:] = [{**fake_nvml.gpus[0], "index": g["index"]} for g in fake_nvml.gpus]
    shared_store.init(root)
    before, after = Agent(settings(), root, "gpu07"), Agent(settings(), root, "gpu07")
    cpu_only = Agent(settings(), root, "cpu01")
    nvml_only = Agent(settings(collectors=("nvml",)), root, "gpu09")
    stops = Agent(settings(), root, "gpu08")
    _fleet(
        root,
        fake_nvml,
        {
            # restarted near the end, and the driver is gone
            "gpu07": lambda i: (before, False) if i < SAMPLES - 8 else (after, True),
            "cpu01": lambda i: (cpu_only, True),  # never had NVML: not a failure
            "gpu09": lambda i: (nvml_only, True),  # its only collector cannot run: health alone
            "gpu08": lambda i: (stops if i < SAMPLES - 14 else None, False),  # goes silent
        },
    )
    return root


def test_a_failing_collector_is_the_reason_not_too_little_data(store: Path) -> None:
    result = analyze(store, _analysis_settings())
    verdicts = {n.node: (n.verdict, n.reasons) for n in result.nodes}
    assert {verdicts[n][0] for n in HEALTHY} == {"healthy"}
    assert verdicts["gpu07"] == (
        "unknown",
        ("collector nvml failing: no NVIDIA driver (libnvidia-ml not found)",),
    )
    assert verdicts["gpu09"] == (
        "unknown",
        ("collector nvml failing: no NVIDIA driver (libnvidia-ml not found)",),
    )
    assert verdicts["cpu01"] == ("healthy", ())  # host and InfiniBand data, and no GPUs
    assert verdicts["gpu08"] == ("unknown", ("too little data in the newest window",))


def test_before_it_failed_the_same_node_was_healthy(store: Path) -> None:
    at = TS + (SAMPLES - 9) * INTERVAL  # the last sample before the restart
    verdict = analyze(store, _analysis_settings(), at).verdict_of("gpu07")
    assert verdict is not None and verdict.verdict == "healthy"


def test_health_records_are_schema_v1(store: Path) -> None:
    result = agent_records(store, "gpu07")
    assert result.bad_total == 0
    health = [r for r in result.records if r["kind"] == "agent" and r["collector"] == "nvml"]
    assert len(health) == SAMPLES
    assert {(r["state"], r["ok"]) for r in health[: SAMPLES - 8]} == {("ok", True)}
    assert {(r["state"], r["ok"]) for r in health[SAMPLES - 8 :]} == {("unavailable", False)}


def test_export_has_each_collector_s_success_and_duration(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "textfile" / "guardctl.prom"
    out.parent.mkdir()
    res = CliRunner().invoke(
        main,
        ["--set", "analyze.window_s=60", "export", "--prometheus", str(out), "--input", str(store)],
    )
    assert res.exit_code == 0, res.output
    families = {f.name: f for f in text_string_to_metric_families(out.read_text())}
    success = {
        (s.labels["node"], s.labels["collector"]): s.value
        for s in families["guardctl_agent_collector_success"].samples
    }
    assert success[("gpu07", "nvml")] == 0.0 and success[("gpu01", "nvml")] == 1.0
    assert success[("cpu01", "host")] == 1.0 and success[("cpu01", "nvml")] == 0.0
    assert ("gpu08", "nvml") in success  # its last word, whenever that was
    duration = families["guardctl_agent_collector_duration_seconds"].samples
    assert {(s.labels["node"], s.labels["collector"]) for s in duration} == set(success)
    assert all(s.value >= 0 for s in duration)
    unknown = {s.labels["node"] for s in families["guardctl_node_unknown"].samples if s.value}
    assert unknown == {"gpu07", "gpu08", "gpu09"}
