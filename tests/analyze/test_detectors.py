"""Each detector on small hand-made traces: the fault is found, each confounder stays healthy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from anatrace import Trace, detectors_of, verdicts

from guardctl.analyze import thresholds
from guardctl.config import Settings

SICK = "gn03"
ONSET = 5.0  # minutes into the 20-minute trace


def _thermal(tr: Trace) -> None:
    i, n = tr.at(ONSET), tr.node(SICK)
    tr.gpu["temp_c"][i:, n, 2] += 25
    tr.gpu["clock_event_reasons"][i:, n, 2] |= 0x40
    tr.gpu["sm_clock_mhz"][i:, n, 2] = (tr.gpu["sm_clock_mhz"][i:, n, 2] * 0.8).astype(int)


def _power_brake(tr: Trace) -> None:
    i, n = tr.at(ONSET), tr.node(SICK)
    tr.gpu["power_w"][i:, n, :] *= 0.45
    tr.gpu["clock_event_reasons"][i:, n, :] |= 0x80


def _low_power_only(tr: Trace) -> None:
    tr.gpu["power_w"][tr.at(ONSET) :, tr.node(SICK), 5] *= 0.6


def _stuck_clock(tr: Trace) -> None:
    tr.gpu["sm_clock_mhz"][tr.at(ONSET) :, tr.node(SICK), 1] = 1100


def _slow_rank(tr: Trace) -> None:
    tr.slow[tr.at(ONSET) :, tr.node(SICK), 6] = 1.15


def _slow_rank_of_a_small_job(tr: Trace) -> None:
    # a job of two ranks: no peers to judge by, so the rank's own first window must
    tr.ranks[:] = False
    tr.ranks[tr.node(SICK), 0] = tr.ranks[tr.node("gn01"), 0] = True
    tr.slow[tr.at(ONSET) :, tr.node(SICK), 0] = 1.5


def _xid(tr: Trace) -> None:
    tr.gpu["xid"][tr.at(14), tr.node(SICK), 4] = 79


def _dbe(tr: Trace) -> None:
    tr.gpu["ecc_dbe_volatile"][tr.at(14) :, tr.node(SICK), 0] = 1


def _pcie(tr: Trace) -> None:
    i, n = tr.at(ONSET), tr.node(SICK)
    tr.gpu["pcie_replay"][i:, n, 3] = 20 * np.arange(1, tr.t.size - i + 1)


def _downshift(tr: Trace) -> None:
    tr.nic["rate_gbps"][tr.at(ONSET) :, tr.node(SICK), 2] = 200.0


def _link_errors(tr: Trace) -> None:
    i, n = tr.at(ONSET), tr.node(SICK)
    tr.nic["symbol_errors"][i:, n, 1] = 3 * np.arange(1, tr.t.size - i + 1)


def _flaps(tr: Trace) -> None:
    n = tr.node(SICK)
    for i in range(tr.at(ONSET), tr.t.size, 9):  # every 90 s
        tr.nic["link_downed"][i:, n, 0] += 1
        tr.nic["state"][i, n, 0] = "DOWN"


def _xmit_wait(tr: Trace) -> None:
    i, n = tr.at(ONSET), tr.node(SICK)
    extra = 400_000 * np.arange(1, tr.t.size - i + 1)
    tr.nic["xmit_wait"][i:, n, 3] += extra


def _contention(tr: Trace) -> None:
    tr.host["load1"][tr.at(ONSET) :, tr.node(SICK)] += 70


FAULTS: list[tuple[str, Callable[[Trace], None], str]] = [
    ("thermal throttling", _thermal, "thermal"),
    ("thermal bits", _thermal, "clock_events"),
    ("power brake", _power_brake, "clock_events"),
    ("power below peers", _low_power_only, "power"),
    ("stuck clock", _stuck_clock, "clocks"),
    ("slow GPU seen only in busy time", _slow_rank, "busy_time"),
    ("small job's rank slower than its own history", _slow_rank_of_a_small_job, "busy_history"),
    ("hardware XID", _xid, "xid"),
    ("double-bit ECC", _dbe, "ecc"),
    ("PCIe replays rising", _pcie, "gpu_links"),
    ("link downshift", _downshift, "link_rate"),
    ("rising link errors", _link_errors, "link_errors"),
    ("link flaps", _flaps, "link_flaps"),
    ("transmit wait", _xmit_wait, "xmit_wait"),
    ("host contention", _contention, "host_contention"),
]


@pytest.mark.parametrize(("label", "inject", "detector"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_found(
    tmp_path: Path, label: str, inject: Callable[[Trace], None], detector: str
) -> None:
    tr = Trace(tmp_path, idle=1)
    inject(tr)
    result = tr.analyze()
    got = verdicts(result)
    assert got[SICK] == "suspect", (label, result.verdict_of(SICK))
    assert detector in detectors_of(result, SICK)
    # nobody else is blamed
    assert [n for n, v in got.items() if v != "healthy"] == [SICK]
    ev = result.verdict_of(SICK).evidence  # type: ignore[union-attr]
    assert all(e.window_end <= result.window_end for e in ev)


def _whole_job_slow(tr: Trace) -> None:
    tr.slow[tr.at(5) : tr.at(15)] *= 1.5  # checkpoint / file-system stall: every rank


def _warm_rack(tr: Trace) -> None:
    tr.gpu["temp_c"][:, :3, :] += 12  # three nodes warmer, no throttling


def _power_cap_bits(tr: Trace) -> None:
    busy = tr.busy[None, :, None]
    bits = tr.rng.choice([0x4, 0x10, 0x4 | 0x10, 0], size=tr.gpu["clock_event_reasons"].shape)
    tr.gpu["clock_event_reasons"] = np.where(busy, bits, 0x1)


def _odd_sample(tr: Trace) -> None:
    n = tr.node(SICK)
    i = tr.at(17)
    tr.gpu["clock_event_reasons"][i, n, 2] |= 0x40
    tr.gpu["sm_clock_mhz"][i, n, 2] = 900
    tr.gpu["temp_c"][i, n, 2] = 95
    tr.host["load1"][i, n] = 90


def _big_constant_counters(tr: Trace) -> None:
    tr.nic["symbol_errors"][:, :, :] += 4_000_000_000
    tr.nic["link_downed"][:, :, :] += 12
    tr.gpu["ecc_sbe_volatile"][:, :, :] += 1_000_000
    tr.gpu["pcie_replay"][:, :, :] += 50_000


def _counter_reset(tr: Trace) -> None:
    n = tr.node(SICK)
    tr.nic["symbol_errors"][: tr.at(10), n, :] = 900_000
    tr.gpu["pcie_replay"][: tr.at(10), n, :] = 70_000  # a reboot zeroes them


def _application_xid(tr: Trace) -> None:
    tr.gpu["xid"][tr.at(16), tr.node(SICK), 1] = 13


def _single_flap(tr: Trace) -> None:
    n = tr.node(SICK)
    tr.nic["link_downed"][tr.at(16) :, n, 0] += 1
    tr.nic["state"][tr.at(16), n, 0] = "DOWN"


def _fabric_at_200(tr: Trace) -> None:
    tr.nic["rate_gbps"][:] = 200.0


def _clock_skew(tr: Trace) -> None:
    tr.skew[tr.node(SICK)] = 35.0
    tr.skew[tr.node("gn01")] = -20.0


def _small_job_slows_at_once(tr: Trace) -> None:
    # a two-rank job's new phase (longer sequences, say): both ranks slow down together
    tr.ranks[:] = False
    tr.ranks[tr.node(SICK), 0] = tr.ranks[tr.node("gn01"), 0] = True
    tr.slow[tr.at(ONSET) :] *= 1.5


CONFOUNDERS: list[tuple[str, Callable[[Trace], None]]] = [
    ("small job slows at once", _small_job_slows_at_once),
    ("whole job slows at once", _whole_job_slow),
    ("warm rack without throttling", _warm_rack),
    ("power cap and sync boost bits", _power_cap_bits),
    ("one odd sample", _odd_sample),
    ("large constant counters", _big_constant_counters),
    ("counter reset", _counter_reset),
    ("application XID", _application_xid),
    ("one link flap", _single_flap),
    ("whole fabric at one rate", _fabric_at_200),
    ("clock skew between nodes", _clock_skew),
]


@pytest.mark.parametrize(("label", "inject"), CONFOUNDERS, ids=[c[0] for c in CONFOUNDERS])
def test_confounder_stays_healthy(
    tmp_path: Path, label: str, inject: Callable[[Trace], None]
) -> None:
    tr = Trace(tmp_path, idle=2)  # idle nodes are a confounder in every case
    inject(tr)
    result = tr.analyze()
    # A flap is flagged in its one window: watched, never persistent enough to be suspect.
    watched = dict.fromkeys([SICK] if label == "one link flap" else [], "watch")
    assert {n: v for n, v in verdicts(result).items() if v != "healthy"} == watched, [
        (n.node, n.verdict, n.reasons) for n in result.nodes if n.verdict != "healthy"
    ]


def test_telemetry_gap_in_newest_window_is_unknown_not_suspect(tmp_path: Path) -> None:
    tr = Trace(tmp_path)
    _stuck_clock(tr)  # even a faulty node: without data now, the analyzer cannot say
    tr.present[tr.at(16) :, tr.node(SICK)] = False
    tr.present[tr.at(17) :, tr.node("gn01")] = False
    got = verdicts(tr.analyze())
    assert got[SICK] == "unknown"
    assert got["gn01"] == "unknown"
    assert got["gn02"] == "healthy"


def test_gap_in_the_past_stays_healthy(tmp_path: Path) -> None:
    tr = Trace(tmp_path)
    tr.present[tr.at(8) : tr.at(12), tr.node(SICK)] = False
    assert set(verdicts(tr.analyze()).values()) == {"healthy"}


def test_persistence_needs_k_of_n_windows(tmp_path: Path) -> None:
    """A fault in only the newest window is not yet a finding, but watched; k=1 makes it one."""
    tr = Trace(tmp_path)
    tr.gpu["sm_clock_mhz"][tr.at(16) :, tr.node(SICK), 1] = 1100
    result = tr.analyze()
    v = result.verdict_of(SICK)
    assert v is not None and v.verdict == "watch"
    assert v.flagged_windows == 1 and "not persistent" in v.reasons[0]
    assert result.counts()["watch"] == 1 and result.suspects == []
    result = tr.analyze("analyze.persist_k=1")
    assert verdicts(result)[SICK] == "suspect"


def test_thresholds_come_from_config(tmp_path: Path) -> None:
    tr = Trace(tmp_path)
    _slow_rank(tr)
    assert verdicts(tr.analyze())[SICK] == "suspect"
    relaxed = tr.analyze("analyze.detectors.busy_time.rel=0.5")
    assert verdicts(relaxed)[SICK] == "healthy"
    off = tr.analyze("analyze.detectors.busy_time.enabled=0")
    assert verdicts(off)[SICK] == "healthy"


def test_unknown_detector_or_key_is_a_config_error() -> None:
    from guardctl.config import load_settings
    from guardctl.errors import ConfigError

    settings = load_settings(assignments=["analyze.detectors.clockz.rel=1"], environ={})
    with pytest.raises(ConfigError, match="unknown detector"):
        thresholds(settings.analyze)
    settings = load_settings(assignments=["analyze.detectors.clocks.rell=1"], environ={})
    with pytest.raises(ConfigError, match="unknown threshold"):
        thresholds(settings.analyze)


def test_every_detector_has_a_test() -> None:
    tested = {d for _, _, d in FAULTS}
    assert tested == set(thresholds(Settings().analyze)), "a detector without a fault test"


def test_evidence_names_metric_reference_and_deviation(tmp_path: Path) -> None:
    tr = Trace(tmp_path)
    _stuck_clock(tr)
    v = tr.analyze().verdict_of(SICK)
    assert v is not None and v.gpus == (1,)
    clocks = next(e for e in v.evidence if e.detector == "clocks")
    assert clocks.metric == "sm_clock_mhz" and clocks.gpu == 1
    assert clocks.value == 1100
    assert 1950 < clocks.reference < 1990
    assert clocks.deviation is not None and -0.46 < clocks.deviation < -0.42
    assert any(r.startswith("clocks: GPU 1") for r in v.reasons)
