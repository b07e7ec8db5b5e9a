"""``[analyze] threads``: how many threads a pass computes with, from the setting or the machine."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from guardctl.analyze import engine, features, mirrors
from guardctl.analyze.engine import analyze
from guardctl.analyze.incremental import Analyzer
from guardctl.config import Settings, build_settings, default_layers
from guardctl.errors import ConfigError
from guardctl.simulate import simulate

START = 1_764_547_200.0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("threads") / "store"
    simulate(root, nodes=24, duration=900.0, seed=5, faults="all", start=START)
    return root


def _settings(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "guardctl.toml"
    path.write_text(text)
    layers = default_layers(
        system_config=tmp_path / "none.toml",
        system_conf_d=tmp_path / "conf.d",
        extra_files=[path],
        environ={},
    )
    return build_settings(layers)


def _with_threads(settings: Settings, threads: int) -> Settings:
    return dataclasses.replace(
        settings, analyze=dataclasses.replace(settings.analyze, threads=threads)
    )


def test_the_setting_is_read_and_zero_means_the_processors_this_process_may_use(
    tmp_path: Path,
) -> None:
    assert _settings(tmp_path, "[analyze]\nthreads = 3\n").analyze.threads == 3
    assert _settings(tmp_path, "[analyze]\nthreads = 3\n").analyze.pass_threads() == 3
    default = Settings().analyze
    assert default.threads == 0
    assert default.pass_threads() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("value", "says"),
    [("-1", "threads: must be >= 0"), ("'many'", "expected an integer"), ("1.5", "integer")],
)
def test_a_bad_count_is_a_one_line_error_naming_the_key(
    tmp_path: Path, value: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, f"[analyze]\nthreads = {value}\n")
    message = str(info.value)
    assert "threads" in message and says in message and "\n" not in message


def test_every_pool_of_a_pass_has_the_setting_s_threads(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding the mirrors, figuring the tables and running the detectors: each pool a cold
    pass and an incremental pass start has as many threads as ``[analyze] threads`` says."""
    sizes: list[int | None] = []
    real = concurrent.futures.ThreadPoolExecutor

    def counted(max_workers: int | None = None, *args: Any, **kw: Any) -> Any:
        sizes.append(max_workers)
        return real(max_workers, *args, **kw)

    for module in (engine, features, mirrors):
        monkeypatch.setattr(module, "ThreadPoolExecutor", counted)
    settings = _with_threads(Settings(), 3)
    analyze(store, settings)
    cold = len(sizes)
    # On the minute grid, as the daemon passes: a first pass also figures ahead the windows
    # the next passes judge.
    Analyzer(settings, store, grid_s=60.0).analyze()
    assert cold >= 3 and len(sizes) > cold + 3  # (decoding, the tables, the detectors)
    assert set(sizes) == {3}


def test_one_thread_judges_as_several_do(store: Path) -> None:
    """The threads only share the work: one thread's analysis is the same, cold and
    incremental."""
    one, four = _with_threads(Settings(), 1), _with_threads(Settings(), 4)
    assert analyze(store, one).to_dict() == analyze(store, four).to_dict()
    at = START + 600.0
    assert Analyzer(one, store).analyze(at).to_dict() == Analyzer(four, store).analyze(at).to_dict()
