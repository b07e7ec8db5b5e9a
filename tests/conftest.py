"""Project-wide pytest fixtures: the local Slurm lab.

Fixtures (see tests/labtools.py for the Lab API and slurm/lab/README.md):

``slurm_lab`` (session)
    A private 4-node lab for this test session, started with
    ``slurm/lab/up.sh --dir /tmp/guardctl-lab-XXXX --port <free> --nodes 4
    --cluster lab<random>`` and stopped (down.sh --purge) at session end.
``lab`` (function)
    ``slurm_lab`` after ``reset()``: no jobs, no reservations, all nodes idle.
``lab_factory`` (session)
    ``lab_factory(nodes=4, up_args=[...])`` starts one more private lab
    (e.g. with ``--prolog PATH``); all are stopped at session end.

``GUARDCTL_LAB_RELEASE`` (22.05, 24.11 or 26.05; default: the host's) picks the Slurm
release of every lab of the session; a release other than the host's runs in a cached
Debian root (``up.sh --release``).  ``tests/run.sh`` runs the ``slurm`` tests on each.

Tests using any of these get the ``slurm`` marker automatically.  Where the
machine cannot run a lab (not root, no Slurm and no apt-get) they are skipped,
except under CI=true, where they fail: CI must not silently skip them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from labtools import Lab, LabError, lab_unavailable_reason, reap_stale_labs

LAB_FIXTURES = frozenset({"slurm_lab", "lab", "lab_factory"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slurm: needs the local Slurm lab (slurm/lab/up.sh); skipped where the machine "
        "cannot run it, but fails under CI=true",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if LAB_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _require_lab() -> None:
    reason = lab_unavailable_reason()
    if reason is None:
        return
    if _in_ci():
        pytest.fail(f"CI=true but the Slurm lab cannot run here: {reason}", pytrace=False)
    pytest.skip(f"Slurm lab unavailable: {reason}")


def _start(nodes: int = 4, up_args: Sequence[str] = ()) -> Lab:
    _require_lab()
    try:
        return Lab.start(nodes=nodes, up_args=up_args)
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)


def _stop(lab: Lab, keep: bool) -> None:
    if keep:
        lab.down(check=False)
        sys.stderr.write(f"\nSlurm lab {lab.cluster} kept for inspection in {lab.dir}\n")
    else:
        lab.down(purge=True, check=False)
        shutil.rmtree(lab.dir, ignore_errors=True)


def _keep(request: pytest.FixtureRequest) -> bool:
    """Keep a lab's files after the session if tests failed or GUARDCTL_LAB_KEEP=1."""
    return os.environ.get("GUARDCTL_LAB_KEEP") == "1" or request.session.testsfailed > 0


@pytest.fixture(scope="session")
def slurm_lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """The session's private 4-node lab (state may be dirty: prefer ``lab``)."""
    _require_lab()
    reap_stale_labs()
    lab = _start(nodes=4)
    try:
        yield lab
    finally:
        _stop(lab, _keep(request))


@pytest.fixture
def lab(slurm_lab: Lab) -> Lab:
    """``slurm_lab`` reset to a clean, all-idle cluster for this test."""
    slurm_lab.reset()
    return slurm_lab


@pytest.fixture(scope="session")
def lab_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., Lab]]:
    """Start extra private labs: ``lab_factory(nodes=2, up_args=["--prolog", p])``."""
    labs: list[Lab] = []

    def make(nodes: int = 4, up_args: Sequence[str] = ()) -> Lab:
        new = _start(nodes=nodes, up_args=up_args)
        labs.append(new)
        return new

    try:
        yield make
    finally:
        keep = _keep(request)
        for one in labs:
            _stop(one, keep)
