"""The column layout of telemetry: which column each schema field becomes, derived from the schema.

The analyzer holds records as columns (one array per field), and the column
mirrors store them as rows of the same slots; both take their layout from
here, and this module takes it from the schema's one field list
(:data:`guardctl.telemetry.schema.FIELDS`), so a field added to the schema is
a column everywhere. Per kind, in the schema's order of fields:

- numbers become float columns (absent: NaN);
- integers and booleans become integer columns (absent: :data:`INT_MISSING`;
  ``xid`` null or absent: :data:`NO_XID`);
- strings become indices into a string table (absent: -1); fields that together
  name one thing are one column: a NIC port is ``"<device>:<port>"``.

:attr:`Layout.fingerprint` digests all of it: a column mirror written under
another layout (fields reordered, added, retyped) carries another fingerprint
and is ignored, never misread. No numpy here: writers in training ranks use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from guardctl.telemetry import schema

INT_MISSING = -(2**63)  # an integer field absent from the record (int64's minimum)
INT_MAX = 2**63 - 1
NO_XID = -1  # "xid": null, no XID in the interval

# Fields stored together as one string column, named after the column: "<device>:<port>".
JOINED: dict[str, dict[str, tuple[str, ...]]] = {"nic": {"port": ("device", "port")}}
# The string table each string column indexes ("node" is every kind's).
TABLE_OF = {
    "node": "nodes",
    "job": "jobs",
    "port": "ports",
    "state": "states",  # NIC port states and collector states, as written
    "collector": "collectors",
    "error": "errors",
}


@dataclass(frozen=True)
class KindLayout:
    """The columns of one record kind, each group in the schema's order of fields."""

    floats: tuple[str, ...]
    ints: tuple[str, ...]
    strings: tuple[str, ...]
    # string column -> the fields it is made of (a field of its own: just that one)
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def slots(self) -> tuple[str, ...]:
        """Every column but ``ts`` and ``node``, in slot order (floats, integers, strings)."""
        return (*self.floats, *self.ints, *self.strings)

    @property
    def raw(self) -> tuple[str, ...]:
        """The record fields the string columns are made of."""
        return tuple(name for col in self.strings for name in self.sources[col])


def _kind_layout(kind: str, fields: Mapping[str, tuple[type, ...]]) -> KindLayout:
    joined = JOINED.get(kind, {})
    member_of = {name: col for col, names in joined.items() for name in names}
    floats, ints, strings = [], [], []
    sources: dict[str, tuple[str, ...]] = {}
    for name, types in fields.items():
        if name in member_of:
            col = member_of[name]
            if col not in sources:
                strings.append(col)
                sources[col] = joined[col]
        elif str in types:
            strings.append(name)
            sources[name] = (name,)
        elif float in types:
            floats.append(name)
        else:  # int, bool
            ints.append(name)
    return KindLayout(tuple(floats), tuple(ints), tuple(strings), sources)


@dataclass(frozen=True)
class Layout:
    """Columns of every kind, the string tables, and their fingerprint."""

    kinds: Mapping[str, KindLayout]

    @classmethod
    def of(cls, fields: Mapping[str, Mapping[str, tuple[type, ...]]]) -> Layout:
        return cls({kind: _kind_layout(kind, spec) for kind, spec in fields.items()})

    @property
    def tables(self) -> tuple[str, ...]:
        """The string tables, ``nodes`` first, then in order of first use by a kind."""
        names = ["nodes"]
        for kl in self.kinds.values():
            names += [TABLE_OF[c] for c in kl.strings if TABLE_OF[c] not in names]
        return tuple(names)

    @property
    def max_slots(self) -> int:
        return max(len(kl.slots) for kl in self.kinds.values())

    def describe(self) -> str:
        """The layout as text: what the fingerprint digests."""
        parts = [f"tables={','.join(self.tables)}"]
        for kind, kl in self.kinds.items():
            strings = [f"{c}<{TABLE_OF[c]}:{'+'.join(kl.sources[c])}" for c in kl.strings]
            parts.append(
                f"{kind}:f={','.join(kl.floats)};i={','.join(kl.ints)};s={','.join(strings)}"
            )
        return "\n".join(parts)

    @cached_property
    def fingerprint(self) -> int:
        """The 64-bit FNV-1a hash of :meth:`describe` (written in every mirror's preamble).

        It tells layouts apart, it does not guard against forgery: a plain hash
        spares every training rank the 3.7 MiB of OpenSSL that hashlib loads.
        """
        value = 0xCBF29CE484222325
        for byte in self.describe().encode():
            value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        return value


LAYOUT = Layout.of(schema.FIELDS)
TABLES = LAYOUT.tables
FLOATS = {kind: kl.floats for kind, kl in LAYOUT.kinds.items()}
INTS = {kind: kl.ints for kind, kl in LAYOUT.kinds.items()}
STRINGS = {kind: kl.strings for kind, kl in LAYOUT.kinds.items()}
