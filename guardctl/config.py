"""Layered TOML configuration, validated into typed, frozen settings.

Layers, later ones winning key by key:

1. ``/etc/guardctl/guardctl.toml``
2. ``/etc/guardctl/conf.d/*.toml`` in name order
3. the file named by ``$GUARDCTL_CONFIG``
4. ``--config FILE`` on the command line
5. ``--set section.key=value`` on the command line
6. ``$GUARDCTL_STORE`` for ``store.root`` (so a training job's probe can be pointed elsewhere)

Each layer is validated on its own before merging, so an error names the file
and the key that are wrong. The schema is the set of section dataclasses in
:mod:`guardctl.sections`; adding a setting means adding a field there.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl.errors import ConfigError
from guardctl.sections.agent import AgentSettings
from guardctl.sections.analyze import AnalyzeSettings
from guardctl.sections.control import ControlSettings
from guardctl.sections.dds import DdsSettings
from guardctl.sections.hooks import HooksSettings
from guardctl.sections.quarantine import QuarantineSettings
from guardctl.sections.safety import SafetySettings
from guardctl.sections.slurm import SlurmSettings
from guardctl.sections.source import SourceSettings
from guardctl.sections.store import StoreSettings
from guardctl.sections.sweep import SweepSettings

SYSTEM_CONFIG = Path("/etc/guardctl/guardctl.toml")
SYSTEM_CONF_D = Path("/etc/guardctl/conf.d")
ENV_CONFIG = "GUARDCTL_CONFIG"
ENV_STORE = "GUARDCTL_STORE"


@dataclass(frozen=True)
class Settings:
    """All of guardctl's settings; every section has defaults."""

    store: StoreSettings = field(default_factory=StoreSettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    safety: SafetySettings = field(default_factory=SafetySettings)
    quarantine: QuarantineSettings = field(default_factory=QuarantineSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    analyze: AnalyzeSettings = field(default_factory=AnalyzeSettings)
    sweep: SweepSettings = field(default_factory=SweepSettings)
    dds: DdsSettings = field(default_factory=DdsSettings)
    source: SourceSettings = field(default_factory=SourceSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    hooks: HooksSettings = field(default_factory=HooksSettings)
    sources: tuple[str, ...] = ()  # the layers that were read, for `guardctl config`


@dataclass(frozen=True)
class Layer:
    """One source of settings: its name (a path or '--set') and its table."""

    origin: str
    table: Mapping[str, Any]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check *value* against annotation *tp*; return it converted (Path, tuple)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for alt in args:
            if alt is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, alt, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(
            f"{where}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}"
        )
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(
                f"{where}: expected one of {', '.join(map(repr, args))}, got {value!r}"
            )
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return _build(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):  # TOML reads nan and inf: a NaN lease would never expire
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: expected a path, got {value!r}")
        return Path(value)
    raise ConfigError(f"{where}: unsupported setting type {tp!r}")


def _build(cls: Any, table: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "sources"}
    kwargs = {}
    for key, value in table.items():
        path = f"{where}.{key}" if where else key
        if key not in known:
            raise ConfigError(f"{path}: unknown setting")
        kwargs[key] = _coerce(value, hints[key], path)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from None


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def read_toml(path: Path) -> dict[str, Any]:
    """Read one TOML file; any error becomes a :class:`ConfigError` naming the file."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def parse_assignment(text: str) -> dict[str, Any]:
    """Turn ``section.key=value`` (value in TOML syntax, bare words as strings) into a table."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # bare words are strings: --set store.root=/data/guardctl
    table: dict[str, Any] = {}
    node = table
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return table


def default_layers(
    extra_files: Iterable[Path] = (),
    assignments: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    system_config: Path = SYSTEM_CONFIG,
    system_conf_d: Path = SYSTEM_CONF_D,
) -> list[Layer]:
    """Collect the layers in precedence order (lowest first)."""
    env = os.environ if environ is None else environ
    files: list[Path] = []
    if system_config.is_file():
        files.append(system_config)
    if system_conf_d.is_dir():
        files.extend(sorted(p for p in system_conf_d.glob("*.toml") if p.is_file()))
    if env.get(ENV_CONFIG):
        files.append(Path(env[ENV_CONFIG]))
    files.extend(extra_files)
    layers = [Layer(str(p), read_toml(p)) for p in files]
    layers.extend(Layer("--set", parse_assignment(a)) for a in assignments)
    if env.get(ENV_STORE):
        layers.append(Layer(f"${ENV_STORE}", {"store": {"root": env[ENV_STORE]}}))
    return layers


def build_settings(layers: Iterable[Layer]) -> Settings:
    """Validate every layer, merge them, and build the final :class:`Settings`."""
    merged: dict[str, Any] = {}
    sources = []
    for layer in layers:
        try:
            _build(Settings, layer.table, "")  # validate this layer alone: errors name it
        except ConfigError as exc:
            raise ConfigError(f"{layer.origin}: {exc}") from None
        merged = _merge(merged, layer.table)
        sources.append(layer.origin)
    try:
        built = _build(Settings, merged, "")
        _check_across_sections(built)
    except ConfigError as exc:  # a cross-field check failed only after merging
        raise ConfigError(
            f"merged configuration ({', '.join(sources) or 'defaults'}): {exc}"
        ) from None
    return dataclasses.replace(built, sources=tuple(sources))


# The daemon renews its lease every lease_s / 3 between passes, not inside one, so a pass must
# end well within the lease; a healthy pass takes less than the pause between passes.
LEASE_PER_INTERVAL = 3.0


def _check_across_sections(settings: Settings) -> None:
    """Checks between settings that several layers may set (so only on the merged result)."""
    check_lease(settings.control.lease_s, settings.control.interval_s, "control.interval_s")


def check_lease(lease_s: float, interval_s: float, interval_from: str) -> None:
    """The lease must outlast a pass by far: ``lease_s >= 3 x`` the pass interval."""
    if lease_s < LEASE_PER_INTERVAL * interval_s:
        raise ConfigError(
            f"control.lease_s = {lease_s:g}: must be at least {LEASE_PER_INTERVAL:g} x the "
            f"pass interval ({interval_from} = {interval_s:g} s), or a leader's lease runs out "
            "inside its own pass"
        )


def load_settings(
    extra_files: Iterable[Path] = (),
    assignments: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Load the settings from every layer (the usual entry point)."""
    return build_settings(default_layers(extra_files, assignments, environ))


def as_dict(settings: Settings) -> dict[str, Any]:
    """Plain-data view of the settings (for ``guardctl config --json``)."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {k: plain(v) for k, v in dataclasses.asdict(settings).items()}


def origins(layers: Iterable[Layer]) -> dict[str, str]:
    """Where each ``section.key`` that a layer sets comes from: the last layer that sets it."""
    found: dict[str, str] = {}
    for layer in layers:
        for section, table in layer.table.items():
            if isinstance(table, Mapping):
                for key in table:
                    found[f"{section}.{key}"] = layer.origin
    return found
