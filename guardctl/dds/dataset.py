"""What a job trains on: the dataset description, its shards, and each epoch's order.

A dataset is a list of files with their record counts (or one index range,
``records=N``). Records are numbered globally in file order; a *shard* is a
run of ``shard_size`` consecutive global indices (the last one may be
shorter). Each epoch visits the shards in an order shuffled by the job's seed,
so every rank and every restart of the service agree on it without storing it.
"""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from typing import Any

from guardctl.errors import InputError, UsageError


@dataclass(frozen=True)
class DataFile:
    """One input file and how many records (samples) it holds."""

    name: str
    records: int


@dataclass(frozen=True)
class Piece:
    """Records ``[start, end)`` of one file (offsets inside that file)."""

    file: str
    start: int
    end: int


@dataclass(frozen=True)
class JobSpec:
    """A job's dataset and how it is handed out: fixed for the life of the job."""

    files: tuple[DataFile, ...]
    shard_size: int
    epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    global_batch: int = 0  # per-step mode only: samples per training step across all ranks

    def __post_init__(self) -> None:
        if not self.files:
            raise UsageError("the dataset is empty: give --records N or a --files list")
        for item in self.files:
            if item.records < 0:
                raise UsageError(f"file {item.name!r}: negative record count")
        if self.total < 1:
            raise UsageError("the dataset holds no records")
        if self.shard_size < 1:
            raise UsageError("shard size must be at least 1")
        if self.epochs < 1:
            raise UsageError("epochs must be at least 1")
        if self.global_batch < 0:
            raise UsageError("global batch must not be negative")

    @cached_property
    def _file_starts(self) -> list[int]:
        return [0, *accumulate(f.records for f in self.files)]

    @cached_property
    def total(self) -> int:
        """Records in one epoch."""
        return sum(f.records for f in self.files)

    @property
    def shards(self) -> int:
        """Shards in one epoch."""
        return -(-self.total // self.shard_size)

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        """Global record indices ``[start, end)`` of *shard*."""
        start = shard * self.shard_size
        return start, min(start + self.shard_size, self.total)

    def shard_len(self, shard: int) -> int:
        start, end = self.shard_bounds(shard)
        return end - start

    def epoch_order(self, epoch: int) -> list[int]:
        """The order in which *epoch* visits the shards (the same on every call)."""
        order = list(range(self.shards))
        if self.shuffle:
            # A string seed hashes deterministically in every process (unlike hash()).
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    @property
    def steps_per_epoch(self) -> int:
        if self.global_batch < 1:
            raise UsageError("this job has no global batch: start the service with --global-batch")
        return -(-self.total // self.global_batch)

    def step_ranges(self, epoch_order: Sequence[int], step: int) -> list[tuple[int, int]]:
        """Global index ranges of the records that step *step* (within its epoch) covers.

        An epoch is the concatenation of its shards in epoch order; a step takes
        the next ``global_batch`` records of it.
        """
        lo = step * self.global_batch
        hi = min(lo + self.global_batch, self.total)
        return self.stream_ranges(epoch_order, lo, hi)

    def stream_ranges(
        self,
        epoch_order: Sequence[int],
        lo: int,
        hi: int,
        ends: Sequence[int] | None = None,
    ) -> list[tuple[int, int]]:
        """Global index ranges of epoch-stream positions ``[lo, hi)``.

        *ends* (the running total of shard sizes in epoch order) may be passed
        in by a caller that asks about the same epoch often.
        """
        if ends is None:
            ends = list(accumulate(self.shard_len(s) for s in epoch_order))
        out: list[tuple[int, int]] = []
        pos = lo
        i = bisect.bisect_right(ends, pos)
        while pos < hi and i < len(epoch_order):
            shard_start, shard_end = self.shard_bounds(epoch_order[i])
            begin_in_stream = ends[i] - (shard_end - shard_start)
            take_from = pos - begin_in_stream
            take_to = min(hi, ends[i]) - begin_in_stream
            a, b = shard_start + take_from, shard_start + take_to
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
            pos = ends[i]
            i += 1
        return out

    def locate(self, start: int, end: int) -> list[Piece]:
        """Map global indices ``[start, end)`` to pieces of files."""
        pieces: list[Piece] = []
        starts = self._file_starts
        i = max(0, bisect.bisect_right(starts, start) - 1)
        pos = start
        while pos < end and i < len(self.files):
            f_lo, f_hi = starts[i], starts[i + 1]
            if f_hi > pos:
                take = min(end, f_hi)
                pieces.append(Piece(self.files[i].name, pos - f_lo, take - f_lo))
                pos = take
            i += 1
        return pieces

    def to_json(self) -> dict[str, Any]:
        return {
            "files": [[f.name, f.records] for f in self.files],
            "shard_size": self.shard_size,
            "epochs": self.epochs,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "global_batch": self.global_batch,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        files = tuple(DataFile(str(n), int(r)) for n, r in data["files"])
        return cls(
            files=files,
            shard_size=int(data["shard_size"]),
            epochs=int(data["epochs"]),
            seed=int(data["seed"]),
            shuffle=bool(data["shuffle"]),
            global_batch=int(data["global_batch"]),
        )


def index_range(records: int) -> tuple[DataFile, ...]:
    """A dataset that is just the indices ``0..records-1``."""
    return (DataFile("range", records),)


def read_files_list(path: Path) -> tuple[DataFile, ...]:
    """Read a dataset list: JSON ``[[name, records], ...]`` or lines ``<records> <name>``.

    The line form is what ``wc -l files*`` prints (its ``total`` line is skipped).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read dataset list {path}: {exc.strerror}") from exc
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
            return tuple(DataFile(str(n), int(r)) for n, r in rows)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{path}: not a JSON list of [name, records] pairs") from exc
    files = []
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split(None, 1)
        if not parts or line.lstrip().startswith("#"):
            continue
        if len(parts) != 2 or not parts[0].isdigit():
            raise InputError(f"{path}:{number}: expected '<records> <file name>'")
        if parts[1].strip() == "total":
            continue
        files.append(DataFile(parts[1].strip(), int(parts[0])))
    return tuple(files)
