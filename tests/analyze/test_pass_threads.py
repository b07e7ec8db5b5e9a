"""``[analyze] threads``: how many threads a pass computes with, from the setting or the machine."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guardctl.analyze import engine, features, frame, mirrors
from guardctl.analyze.engine import analyze
from guardctl.analyze.incremental import Analyzer
from guardctl.analyze.load import read_frame
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
    """Decoding the mirrors, joining what was read, figuring the tables and running the
    detectors: each pool a cold
    pass and an incremental pass start has as many threads as ``[analyze] threads`` says."""
    sizes: list[int | None] = []
    real = concurrent.futures.ThreadPoolExecutor

    def counted(max_workers: int | None = None, *args: Any, **kw: Any) -> Any:
        sizes.append(max_workers)
        return real(max_workers, *args, **kw)

    for module in (engine, features, frame, mirrors):
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


def test_parts_joined_by_several_threads_are_joined_as_by_one(store: Path) -> None:
    """The columns of the parts a pass reads are joined a few at a time: the same frame,
    and the parts let go of what they held."""
    files = sorted(str(p) for p in store.rglob("*.jsonl"))
    assert len(files) > 2

    def parts() -> list[frame.Frame]:
        return [read_frame(store, files=files[i::3], closed_segments=False) for i in range(3)]

    one = frame.concat(parts())
    given = parts()
    three = frame.concat(given, consume=True, threads=3)
    assert all(not part.cols for part in given)
    assert one.nodes == three.nodes and one.jobs == three.jobs and one.ports == three.ports
    assert {k: list(c) for k, c in one.cols.items()} == {k: list(c) for k, c in three.cols.items()}
    assert sum(bool(cols["ts"].size) for cols in one.cols.values()) >= 3  # (GPU, host, steps...)
    for kind, cols in one.cols.items():
        for name, values in cols.items():
            np.testing.assert_array_equal(values, three.cols[kind][name])
