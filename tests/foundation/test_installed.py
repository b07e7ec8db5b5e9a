"""guardctl installed as a site would (a wheel into a venv): the man pages and the hook scripts
are found where pip put them, outside any source checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("guardctl", "man", "slurm", "sweeps", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv with guardctl's wheel (built from this tree) and the test machine's packages."""
    work = tmp_path_factory.mktemp("installed")
    tree = work / "src"
    for part in PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(
                source, tree / part, ignore=shutil.ignore_patterns("__pycache__", "lab", "*.pyc")
            )
        else:
            tree.mkdir(exist_ok=True)
            shutil.copy2(source, tree / part)
    run = {"capture_output": True, "text": True, "timeout": 300}
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(work / "wheel"),
            str(tree),
        ],
        **run,
    )
    assert built.returncode == 0, built.stderr
    prefix = work / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(prefix)], **run
    )
    assert made.returncode == 0, made.stderr
    (wheel,) = (work / "wheel").glob("guardctl-*.whl")
    done = subprocess.run(
        [
            str(prefix / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        **run,
    )
    assert done.returncode == 0, done.stderr
    yield prefix


def installed(prefix: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GUARDCTL", "SLURM", "PYTHON"))}
    return subprocess.run(
        [str(prefix / "bin" / "guardctl"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_man_finds_the_pages_pip_installed(venv: Path, tmp_path: Path) -> None:
    for page, where in (
        ("guardctl", "share/man/man1/guardctl.1"),
        ("guardctl.toml", "share/man/man5/guardctl.toml.5"),
    ):
        proc = installed(venv, "man", page, "--path", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(venv / where)
    shown = installed(venv, "man", cwd=tmp_path)
    assert shown.returncode == 0 and "guardctl" in shown.stdout


def test_install_hooks_takes_the_scripts_pip_installed(venv: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "hooks"
    proc = installed(venv, "install-hooks", "--prefix", str(prefix), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("hook.sh", "prolog.sh", "epilog.sh", "healthcheck.sh"):
        shipped = venv / "share" / "guardctl" / "slurm" / name
        assert (prefix / name).read_bytes() == shipped.read_bytes()
