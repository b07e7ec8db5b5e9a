"""Node-name validation and the one door to external programs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from guardctl import nodes, runner
from guardctl.errors import UsageError


def test_expand_and_fold() -> None:
    assert nodes.expand("node[1-3,7]") == ["node1", "node2", "node3", "node7"]
    assert nodes.expand_all(["node1", "node[1-2]"]) == ["node1", "node2"]
    assert nodes.fold(["gpu003", "gpu001", "gpu002"]) == "gpu[001-003]"


@pytest.mark.parametrize(
    "bad",
    [
        "node1;id",
        "a b",
        "$(x)",
        "-rf",
        "@group",
        "node[1-",
        "n|x",
        "n>x",
        "node1\nnode2",
        "",
        "x" * 70,
        "!node1",
    ],
)
def test_bad_expressions(bad: str) -> None:
    with pytest.raises(UsageError):
        nodes.expand(bad)


def test_run_ok_and_failure() -> None:
    ok = runner.run([sys.executable, "-c", "print('hi')"], timeout=10)
    assert ok.rc == 0 and ok.stdout == "hi\n"
    with pytest.raises(runner.CommandFailed) as info:
        runner.run(
            [sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"],
            timeout=10,
        )
    assert info.value.result is not None and info.value.result.rc == 3
    assert "boom" in str(info.value)


def test_run_never_uses_a_shell(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    out = runner.run(["echo", f"; touch {marker}"], timeout=10)
    assert out.stdout.strip() == f"; touch {marker}" and not marker.exists()
    with pytest.raises(UsageError):
        runner.run("echo hi", timeout=10)  # type: ignore[arg-type]


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = (
        f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
        f"open('{pidfile}', 'w').write(str(p.pid)); time.sleep(60)"
    )
    started = time.monotonic()
    with pytest.raises(runner.CommandTimeout):
        runner.run([sys.executable, "-c", script], timeout=1.5)
    assert time.monotonic() - started < 10
    child = int(pidfile.read_text())
    time.sleep(0.2)
    # The grandchild died with its group (it may linger as a zombie if PID 1 does not reap).
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"


def test_missing_program() -> None:
    with pytest.raises(runner.CommandNotFound):
        runner.run(["/nonexistent/sinfo"], timeout=5)
