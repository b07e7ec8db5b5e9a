"""orjson is an accelerator: without it every command works, on the standard json module.

Each check runs in a subprocess in which importing orjson fails as if it were
not installed (tests/dds/no_orjson.py), so this process's orjson is no help.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from dds_helpers import REPO, ServiceProcess

from guardctl.config import load_settings
from guardctl.dds import Client

NO_ORJSON = Path(__file__).with_name("no_orjson.py")


def _without_orjson(*args: str, store: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    env["GUARDCTL_STORE"] = str(store)
    return subprocess.run(
        [sys.executable, str(NO_ORJSON), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _modules_importing_orjson() -> list[str]:
    found = []
    for path in sorted((REPO / "guardctl").rglob("*.py")):
        if re.search(r"^\s*(import orjson|from orjson)", path.read_text(), re.MULTILINE):
            found.append(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


def test_the_block_works_and_every_module_importing_orjson_falls_back(tmp_path: Path) -> None:
    modules = _modules_importing_orjson()
    assert "guardctl.dds.service" in modules and "guardctl.analyze.frame" in modules
    code = f"""
import importlib, json, sys
try:
    import orjson
except ImportError:
    pass
else:
    raise SystemExit("orjson was not blocked")
for name in {modules!r}:
    importlib.import_module(name)
assert "orjson" not in sys.modules
from guardctl.dds import service
frame = importlib.import_module("guardctl.analyze.frame")
data = {{"shares": {{0: 3, 1: 5}}, "name": "w\\u00e9", "speed": 1.5}}
assert service._json(data) == b'{{"shares":{{"0":3,"1":5}},"name":"w\\xc3\\xa9","speed":1.5}}'
assert service._parse(service._json(data)) == json.loads(json.dumps(data))
assert frame._loads(b'{{"a": [1, 2]}}') == {{"a": [1, 2]}}
print("ok", len({modules!r}))
"""
    done = _without_orjson("-c", code, store=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", str(len(modules))]


@pytest.mark.parametrize(
    ("args", "code"),
    [(["--help"], 0), (["dds", "status", "77", "--json"], 8), (["config"], 0)],
    ids=["help", "dds status", "config"],
)
def test_commands_run_without_orjson(tmp_path: Path, args: list[str], code: int) -> None:
    done = _without_orjson("-m", "guardctl", *args, store=tmp_path)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "orjson" not in done.stderr


def test_the_service_serves_without_orjson(start_service: Callable[..., ServiceProcess]) -> None:
    service = start_service(
        "7101", "--records", "100", "--shard-size", "10", python=[sys.executable, str(NO_ORJSON)]
    )
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    client = Client(service.job, worker="w", settings=settings)
    shard = client.lease()
    assert shard is not None and client.ack(shard)
    assert client.status()["progress"]["epoch_shards_done"] == 1
