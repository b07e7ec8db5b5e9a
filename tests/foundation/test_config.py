"""Layered configuration: precedence, typed validation, errors naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardctl.config import Layer, build_settings, default_layers, load_settings, parse_assignment
from guardctl.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def layers(tmp_path: Path, **kw: object) -> list[Layer]:
    return default_layers(
        system_config=tmp_path / "etc/guardctl.toml", system_conf_d=tmp_path / "etc/conf.d", **kw
    )  # type: ignore[arg-type]


def test_defaults_are_valid() -> None:
    settings = build_settings([])
    assert settings.slurm.backend == "cli" and settings.safety.max_out_nodes > 0


def test_precedence(tmp_path: Path) -> None:
    write(tmp_path / "etc/guardctl.toml", "[safety]\nmax_out_nodes = 5\nmax_out_fraction = 0.2\n")
    write(tmp_path / "etc/conf.d/20-site.toml", "[safety]\nmax_out_nodes = 6\n")
    write(tmp_path / "etc/conf.d/10-base.toml", "[safety]\nmax_out_nodes = 7\n")
    env_file = write(tmp_path / "env.toml", '[store]\nroot = "/env/store"\n')
    cli_file = write(tmp_path / "cli.toml", "[slurm]\ntimeout_s = 3\n")
    found = layers(
        tmp_path,
        extra_files=[cli_file],
        assignments=["slurm.timeout_s=4"],
        environ={"GUARDCTL_CONFIG": str(env_file), "GUARDCTL_STORE": "/job/store"},
    )
    settings = build_settings(found)
    assert settings.safety.max_out_nodes == 6  # conf.d in name order: 20 after 10
    assert settings.safety.max_out_fraction == 0.2  # untouched keys survive merging
    assert settings.slurm.timeout_s == 4.0  # --set beats --config
    assert str(settings.store.root) == "/job/store"  # $GUARDCTL_STORE beats every file
    assert len(settings.sources) == 7


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[safety]\nmax_out_nodes = 'many'\n", "safety.max_out_nodes"),
        ("[safety]\nmax_out_fraction = 2.0\n", "max_out_fraction"),
        ("[slurm]\nbackend = 'rest'\n", "slurm.backend"),
        ("[slurm]\ntimeuot_s = 3\n", "slurm.timeuot_s: unknown setting"),
        ("[nosuch]\nx = 1\n", "nosuch: unknown setting"),
        ("[agent]\ninterval_s = 60\n", "interval_s"),
        ("[safety\n", "invalid TOML"),
        ("[safety]\nobserve_only = 1\n", "safety.observe_only"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    bad = write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as info:
        build_settings(layers(tmp_path, extra_files=[bad]))
    message = str(info.value)
    assert str(bad) in message and key in message


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings([tmp_path / "nope.toml"], environ={})


def test_assignment_parsing() -> None:
    assert parse_assignment("safety.max_out_nodes=4") == {"safety": {"max_out_nodes": 4}}
    assert parse_assignment("store.root=/data/g") == {"store": {"root": "/data/g"}}
    assert parse_assignment("quarantine.users=['root','ops']") == {
        "quarantine": {"users": ["root", "ops"]}
    }
    with pytest.raises(ConfigError):
        parse_assignment("novalue")
