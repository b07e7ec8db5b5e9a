"""Telemetry segments: the spans of UTC time each telemetry and step file covers, and their names.

A segment is a span of UTC time whose length divides an hour (``[store] segment_minutes``:
1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 or 60 minutes), aligned on the hour. Every file a writer
appends to belongs to one segment, and carries its name, so that a reader needs no setting to
know which span a file covers, and a store written with several lengths reads as one:

- an hour: ``20261206T10`` (the name stores have always used);
- a shorter segment: its start, then its length, e.g. ``20261206T1010_10m``.

Files whose names hold no segment name (inputs made by hand) form one group, ``other``: they
are always read, and retention never deletes them. Standard library only: the probe that
training ranks import uses it.
"""

from __future__ import annotations

import calendar
import functools
import math
import os
import re
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

ALLOWED_MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60)
HOUR_MINUTES = 60
# What writers use unless told otherwise: a segment is closed (guardctl.storage.closed) a few
# minutes after the fact, and small enough at 100k GPUs to close within a controller's pass.
DEFAULT_MINUTES = 10
OTHER = "other"
ENV_MINUTES = "GUARDCTL_SEGMENT_MINUTES"
# Clock skew between nodes: a record may sit in the neighbouring segment's file.
SKEW_S = 900.0
# How long after a segment ends its files still get the agents' last batch (every 10 s by
# default) and their clocks' differences: a segment is closed after this, and a reader stops
# holding its files open.
GRACE_S = 120.0
# How long after a segment ends its files may still grow: an agent's backlog after an outage
# lands within its buffer (about 1.6 h at the defaults). Until then a closed segment is looked
# at again and keeps its files' column mirrors, which closing it again reads.
LATE_S = 3 * 3600.0
# A closed segment that may still grow is looked at again once this fraction of its age has
# passed since the last look (ended 2 h ago: every 20 minutes). Looking is a stat of each of
# its files, and the leader passing a minute apart over 3 hours of 10-minute segments would
# stat every node's file of 18 segments each pass (225,000 at 12,500 nodes): a load a
# metadata server feels, for bytes that arrive late only after an agent's outage. Such bytes
# are read from the files meanwhile; only their closing waits.
RECHECK_FRACTION = 1 / 6

_NAME = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(?:(\d{2})_(\d{1,2})m)?")
_SUFFIXES = (".jsonl", ".cols")  # a file and its column mirror
_AGENTS = "telemetry/"  # the store's directory of the agents' files, whose own are segments'
PARSED_MAX = 10_000  # segment names remembered parsed

Span = tuple[float, float]


def check_minutes(minutes: object) -> int:
    """*minutes* as a segment length, or ValueError with a one-line reason."""
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes not in ALLOWED_MINUTES:
        allowed = ", ".join(map(str, ALLOWED_MINUTES))
        raise ValueError(f"segment_minutes: must divide an hour ({allowed}), not {minutes!r}")
    return minutes


def minutes_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The segment length ``$GUARDCTL_SEGMENT_MINUTES`` names, or :data:`DEFAULT_MINUTES` when
    unset or not an allowed length (a writer without a settings file must still write)."""
    text = (os.environ if environ is None else environ).get(ENV_MINUTES, "").strip()
    try:
        return check_minutes(int(text))
    except ValueError:
        return DEFAULT_MINUTES


def segment_name(ts: float, minutes: int = HOUR_MINUTES) -> str:
    """The name of the *minutes*-long segment holding the Unix time *ts*."""
    length = minutes * 60
    start = time.gmtime(int(ts // length) * length)
    if minutes == HOUR_MINUTES:
        return time.strftime("%Y%m%dT%H", start)
    return f"{time.strftime('%Y%m%dT%H%M', start)}_{minutes}m"


def segment_of(path: str | os.PathLike[str]) -> str:
    """The segment a file belongs to, from its name; ``other`` for a file without one."""
    parsed = _parse_file(os.fspath(path))
    return OTHER if parsed is None else parsed[0]


def file_span(path: str | os.PathLike[str]) -> Span | None:
    """When the segment of a file (``.jsonl`` or its ``.cols`` mirror) starts and ends (Unix
    seconds); None for a file without a segment name."""
    parsed = _parse_file(os.fspath(path))
    return None if parsed is None else (parsed[1], parsed[2])


def series(path: str | os.PathLike[str]) -> str:
    """What a writer's files of successive segments share: the path without its segment's
    name (the path itself for a file without one)."""
    text = os.fspath(path)
    parsed = _parse_file(text)
    if parsed is None:
        return text
    at = text.rfind(parsed[0])
    return text[:at] + text[at + len(parsed[0]) :]


def span(name: str) -> Span | None:
    """When the segment *name* starts and ends; None for ``other`` (or any non-name)."""
    parsed = _parse_name(name)
    return None if parsed is None else (parsed[1], parsed[2])


def group_files(files: Iterable[str]) -> dict[str, list[str]]:
    """Files by the segment they belong to (``other`` for those without a segment name)."""
    groups: dict[str, list[str]] = {}
    for path in files:
        groups.setdefault(segment_of(path), []).append(path)
    return groups


def needed(names: Iterable[str], since: float | None, until: float | None) -> list[str]:
    """The segments among *names* that can hold records stamped in [since, until] (None: open),
    in time order; ``other`` always."""
    keep = []
    for name in sorted(set(names)):  # names sort by their start
        bounds = span(name)
        if bounds is None:
            keep.append(name)
            continue
        if since is not None and bounds[1] + SKEW_S < since:
            continue
        if until is not None and bounds[0] - SKEW_S > until:
            continue
        keep.append(name)
    return keep


def newest(names: Iterable[str], until: float | None = None) -> Span | None:
    """The newest segment among *names* (to pick files before reading any), leaving out those
    that start after *until* (now plus the tolerance): one record from a clock hours ahead must
    not move the window hours into the future, past everyone's data."""
    spans = [s for s in map(span, names) if s is not None and (until is None or s[0] <= until)]
    return max(spans) if spans else None


def recent(names: Collection[str], span: float, until: float | None = None) -> list[str] | None:
    """The segments among *names* that can hold the *span* seconds before the newest record
    stamped by *until*; None when no segment is dated (then every file is read)."""
    found = newest(names, until)
    if found is None:
        return None
    # The newest record is at least the newest segment's start, whatever the segment's length.
    return needed(names, found[0] - span, None)


def earliest_start(names: Iterable[str]) -> float | None:
    """When the oldest dated segment among *names* starts; None when none is dated."""
    starts = [s[0] for s in map(span, names) if s is not None]
    return min(starts) if starts else None


def _parse_file(text: str) -> tuple[str, float, float] | None:
    for suffix in _SUFFIXES:
        if text.endswith(suffix):
            end = len(text) - len(suffix)
            break
    else:
        return None
    # A node agent's file is named by its node in its segment's directory
    # (telemetry/<segment>/<node>.jsonl); a rank's step file names its segment after its node
    # and rank (<node>.r<rank>.<segment>.jsonl), as agents' files did in a directory per node.
    slash = text.rfind("/", 0, end)
    parent = text.rfind("/", 0, slash) + 1 if slash > 0 else -1
    if parent >= 0 and text[text.rfind("/", 0, parent - 1) + 1 : parent] == _AGENTS:
        parsed = _parse_name(text[parent:slash])
        if parsed is not None:
            return parsed
    return _parse_name(text[max(slash, text.rfind(".", 0, end)) + 1 : end])


# A pass over 100k GPUs names ~100k files that share a few segment names: each name is parsed
# once, then remembered (bounded).
@functools.lru_cache(maxsize=PARSED_MAX)
def _parse_name(stem: str) -> tuple[str, float, float] | None:
    match = _NAME.fullmatch(stem)
    if match is None:
        return None
    year, month, day, hour, minute, length = match.groups()
    minutes = HOUR_MINUTES if length is None else int(length)
    if minutes not in ALLOWED_MINUTES or (length is not None and minutes == HOUR_MINUTES):
        return None  # an hour is always named the short way
    fields = (int(year), int(month), int(day), int(hour), int(minute or 0), 0)
    try:
        start = float(calendar.timegm(fields))  # a day or hour out of range rolls over: see below
    except ValueError:  # no such month
        return None
    if segment_name(start, minutes) != stem:
        # Not a name a writer makes: a date that does not exist (20261301), or a start not on
        # its length (1007_10m).
        return None
    return stem, start, start + minutes * 60


@dataclass
class Rechecks:
    """When a long-lived caller (the controller's leader) last found each closed segment that
    may still grow as it was closed: a segment that ended less than *window_s* ago is looked
    at again once :data:`RECHECK_FRACTION` of its age has passed since, and once more after
    the window, then never. A segment this caller never looked at is looked at while within
    the window, and taken as it is after it, unless it knows when the leader before it last
    looked (:meth:`adopt`): a leader taking over keeps its predecessor's schedule."""

    window_s: float = LATE_S
    last_look: dict[str, tuple[float, float]] = field(default_factory=dict)  # name: (end, when)

    def due(self, name: str, end: float, now: float) -> bool:
        settles = end + self.window_s
        last = self.last_look.get(name, (end, -math.inf))[1]
        if now >= settles:
            return last < settles and name in self.last_look  # the last look, after the window
        return now - last >= (now - end) * RECHECK_FRACTION

    def saw(self, name: str, end: float, now: float) -> None:
        self.last_look[name] = (end, now)

    def adopt(self, name: str, end: float, looked_at: float | None, now: float) -> None:
        """Take segment *name*, which this caller never looked at, as looked at when the
        leader before it last did (*looked_at*, None if unknown), where that lies between its
        end and *now*. A time outside (clocks apart, a store copied) leaves it to be looked at."""
        if name in self.last_look or looked_at is None or now >= end + self.window_s:
            return
        if end <= looked_at <= now:
            self.saw(name, end, looked_at)

    def forget_settled(self, now: float) -> None:
        """Let go of the segments looked at after their window (never due again), and of those
        a window past it (a caller that did not pass meanwhile, or a segment no longer listed)."""
        window = self.window_s
        self.last_look = {
            n: (e, t)
            for n, (e, t) in self.last_look.items()
            if t < e + window and now < e + 2 * window
        }
