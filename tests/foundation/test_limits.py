"""The open-files limit the services raise for themselves (guardctl.limits)."""

from __future__ import annotations

import os
import resource

import pytest

from guardctl.limits import raise_open_files_limit


def test_the_soft_limit_is_raised_toward_what_is_wanted_never_past_the_hard_one() -> None:
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # never below what this test process holds open (a long run may hold more than 1024)
    low = max(min(1024, hard), len(os.listdir("/proc/self/fd")) + 64)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        want = low + 100 if hard == resource.RLIM_INFINITY else hard + 100
        got = raise_open_files_limit(want)
        now = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert raise_open_files_limit(low - 1) == got  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))
    assert now == (got, hard) and got == (low + 100 if hard == resource.RLIM_INFINITY else hard)


def test_a_limit_the_kernel_refuses_leaves_the_soft_limit_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past fs.nr_open under an unlimited hard limit, setrlimit fails: the service runs on."""
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, resource.RLIM_INFINITY))

    def refuse(_which: int, _limits: tuple[int, int]) -> None:
        raise ValueError("not allowed to raise maximum limit")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert raise_open_files_limit(1 << 30) == 1024
