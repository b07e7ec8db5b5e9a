"""What the node agent costs: CPU time per sample and resident memory, against the raw reads.

The node is 8 GPUs (a fake ``pynvml`` fed with recorded H200 values, swapped in
at the import boundary), 8 InfiniBand ports (a recorded sysfs tree) and the
real host through psutil. In the same run it measures

- ``agent``: one full sample (collector threads, timeouts, records, JSON,
  one write + fsync to the store, the column mirror, the status file), CPU
  seconds per sample; and the same agent without column mirrors
  (``agent.column_files = false``), to show what the mirror costs;
- ``raw``: the same NVML calls, sysfs reads and psutil calls in a plain loop;
- resident memory of a child process running the agent, against a child that
  only does the raw reads (same interpreter and imports).

Real NVML calls cost more than the fake's (each is an ioctl into the driver):
the agent's own overhead is ``agent - raw``, which is what this measures; the
driver's share comes on top on a GPU node (see tools/gpu_truth_agent.py).

    python bench/agent_cost.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SYSFS = ROOT / "tests" / "fixtures" / "sysfs" / "ib8"
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "nvml"))
from fake_pynvml import FakeNvml  # noqa: E402

IB_FILES = [
    f"{port}/{name}"
    for port in sorted(SYSFS.glob("class/infiniband/*/ports/*"))
    for name in (
        "state",
        "rate",
        "counters/symbol_error",
        "counters/link_error_recovery",
        "counters/link_downed",
        "counters/port_rcv_errors",
        "counters/port_xmit_wait",
        "counters/port_xmit_data",
        "counters/port_rcv_data",
    )
]
TARGET_CORE_PCT = 0.5
TARGET_RSS_MIB = 60.0


def install_fake_nvml() -> FakeNvml:
    fake = FakeNvml("h200_sxm_8gpu.json")
    sys.modules["pynvml"] = fake.module()
    return fake


def make_agent(tmp: Path, column_files: bool = True) -> Any:
    from guardctl.agent.daemon import Agent
    from guardctl.sections.agent import AgentSettings

    settings = AgentSettings(
        interval_s=1.0,
        sysfs_root=str(SYSFS),
        status_file=str(tmp / "status.json"),
        column_files=column_files,
    )
    return Agent(settings, tmp / "store", "bench01")


def raw_reads(nv: Any) -> None:
    """The reads alone: what any agent has to do, with nothing around them."""
    import psutil

    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        nv.nvmlDeviceGetPowerUsage(h)
        nv.nvmlDeviceGetEnforcedPowerLimit(h)
        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        nv.nvmlDeviceGetUtilizationRates(h)
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        )
        nv.nvmlDeviceGetPcieReplayCounter(h)
        for link in range(18):
            nv.nvmlDeviceGetNvLinkErrorCounter(h, link, nv.NVML_NVLINK_ERROR_DL_CRC_FLIT)
        nv.nvmlDeviceGetRemappedRows(h)
    for path in IB_FILES:
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 256)
        os.close(fd)
    psutil.cpu_percent(interval=None)
    os.getloadavg()
    psutil.virtual_memory()


def cpu_per_call(fn: Any, n: int) -> float:
    start = time.process_time()  # every thread of the process
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def measure_cpu(samples: int) -> dict[str, float]:
    fake = install_fake_nvml()
    nv = sys.modules["pynvml"]
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as tmp2:
        agent = make_agent(Path(tmp))
        plain = make_agent(Path(tmp2), column_files=False)
        for _ in range(3):
            agent.sample()  # start NVML, prime psutil, open files
            plain.sample()
        nv.nvmlInit()
        raw = cpu_per_call(lambda: raw_reads(nv), samples)
        full = cpu_per_call(agent.sample, samples)
        no_cols = cpu_per_call(plain.sample, samples)
        raw2 = cpu_per_call(lambda: raw_reads(nv), samples)  # again: drift check
        agent.close()
        plain.close()
        records = agent.status()["store"]["written"]
    del fake
    raw = min(raw, raw2)
    return {
        "samples": samples,
        "records_per_sample": records / (samples + 3),
        "agent_cpu_ms": full * 1e3,
        "agent_no_mirror_cpu_ms": no_cols * 1e3,
        "raw_cpu_ms": raw * 1e3,
        "overhead_cpu_ms": (full - raw) * 1e3,
        "agent_vs_raw": full / raw,
        "core_pct_at_1s": full / 1.0 * 100,
    }


def rss_mib() -> float:
    """Peak resident memory of this process image (VmHWM; ru_maxrss survives exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(mode: str, samples: int) -> None:
    """Run inside a fresh interpreter: import what the agent imports, then sample."""
    install_fake_nvml()
    import psutil  # noqa: F401

    import guardctl.collectors  # noqa: F401

    nv = sys.modules["pynvml"]
    with tempfile.TemporaryDirectory() as tmp:
        if mode in ("agent", "agent_no_mirror"):
            agent = make_agent(Path(tmp), column_files=mode == "agent")
            for _ in range(samples):
                agent.sample()
            agent.close()
        else:
            nv.nvmlInit()
            for _ in range(samples):
                raw_reads(nv)
    print(json.dumps({"rss_mib": rss_mib()}))


def measure_rss(samples: int) -> dict[str, float]:
    bare = (
        "import json; print(json.dumps({'rss_mib': [int(l.split()[1]) / 1024.0 for l in "
        "open('/proc/self/status') if l.startswith('VmHWM:')][0]}))"
    )
    runs = {
        "bare": [sys.executable, "-c", bare],  # the interpreter alone
        "raw": [sys.executable, __file__, "--child", "raw", "--samples", str(samples)],
        "agent": [sys.executable, __file__, "--child", "agent", "--samples", str(samples)],
        "agent_no_mirror": [
            sys.executable,
            __file__,
            "--child",
            "agent_no_mirror",
            "--samples",
            str(samples),
        ],
    }
    out = {}
    for mode, argv in runs.items():
        proc = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600)
        out[f"{mode}_rss_mib"] = json.loads(proc.stdout.strip().splitlines()[-1])["rss_mib"]
    out["agent_extra_rss_mib"] = out["agent_rss_mib"] - out["raw_rss_mib"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (for CI)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--samples", type=int, default=0)
    parser.add_argument(
        "--child", choices=["agent", "agent_no_mirror", "raw"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    samples = args.samples or (100 if args.quick else 1000)
    if args.child:
        child(args.child, samples)
        return 0
    result = {**measure_cpu(samples), **measure_rss(samples)}
    result["within_target"] = (
        result["core_pct_at_1s"] < TARGET_CORE_PCT and result["agent_rss_mib"] < TARGET_RSS_MIB
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"agent, 8 GPUs + 8 IB ports + host, {samples} samples "
            f"({result['records_per_sample']:.0f} records each)"
        )
        print(
            f"  CPU per sample: agent {result['agent_cpu_ms']:.2f} ms, raw reads "
            f"{result['raw_cpu_ms']:.2f} ms ({result['agent_vs_raw']:.1f}x), "
            f"overhead {result['overhead_cpu_ms']:.2f} ms; without column mirrors "
            f"{result['agent_no_mirror_cpu_ms']:.2f} ms"
        )
        print(
            f"  at a 1 s interval: {result['core_pct_at_1s']:.3f}% of one core "
            f"(target < {TARGET_CORE_PCT}%)"
        )
        print(
            f"  resident memory: agent {result['agent_rss_mib']:.1f} MiB, raw reads "
            f"{result['raw_rss_mib']:.1f} MiB (+{result['agent_extra_rss_mib']:.1f} MiB), "
            f"bare interpreter {result['bare_rss_mib']:.1f} MiB, without column mirrors "
            f"{result['agent_no_mirror_rss_mib']:.1f} MiB "
            f"(target < {TARGET_RSS_MIB:.0f} MiB)"
        )
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
