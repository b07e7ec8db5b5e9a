"""Installing the Slurm hook scripts from the package, and the slurm.conf lines they need.

``guardctl install-hooks`` copies ``hook.sh``, ``prolog.sh``, ``epilog.sh`` and
``healthcheck.sh`` (installed with the package under ``share/guardctl/slurm``) into one
directory, atomically and mode 0755, and prints the slurm.conf lines to merge. Given the
site's slurm.conf it merges rather than pastes: ``PrologFlags`` keeps the site's flags (a
second ``PrologFlags`` line would replace them: slurm.conf keeps a key's last value), and a
site's own ``Prolog``, ``Epilog`` or ``HealthCheckProgram`` is kept, with guardctl's shown as
a line to chain (commented out, since on 22.05 a second line replaces the first). A file at
the destination that is not one of guardctl's scripts is never overwritten.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from guardctl import datafiles
from guardctl.errors import ConfigError, RefusedError, StoreError
from guardctl.fileio import atomic_write

SCRIPTS = ("hook.sh", "prolog.sh", "epilog.sh", "healthcheck.sh")
DEFAULT_PREFIX = Path("/usr/local/lib/guardctl/slurm")
MARK = "guardctl"  # every script of guardctl's names it in its opening comment
# PrologFlags that make the prolog run at allocation (Contain and X11 imply Alloc).
AT_ALLOCATION = {"alloc", "contain", "x11"}
HOOK_KEYS = {"Prolog": "prolog.sh", "Epilog": "epilog.sh", "HealthCheckProgram": "healthcheck.sh"}
HEALTH_DEFAULTS = {"HealthCheckInterval": "300", "HealthCheckNodeState": "ANY,CYCLE"}


@dataclass(frozen=True)
class Copied:
    """One script: where it goes and what installing it does (install, replace, unchanged)."""

    name: str
    target: Path
    action: str


def source_dir() -> Path:
    """Where the package's hook scripts are (installed share/, or the source checkout)."""
    found = datafiles.find("slurm", "hook.sh")
    if found is None:
        where = ", ".join(str(p) for p in datafiles.candidates("slurm"))
        raise ConfigError(f"guardctl's hook scripts are not installed (looked in {where})")
    return found.parent


def _is_ours(path: Path) -> bool:
    try:
        head = path.read_text(errors="replace")[:400]
    except OSError:
        return False
    return head.startswith("#!") and MARK in head


def plan(prefix: Path) -> list[Copied]:
    """What installing into *prefix* would do; refuses (exit 6) to overwrite a foreign file."""
    source = source_dir()
    copies = []
    for name in SCRIPTS:
        target = prefix / name
        if not target.exists():
            action = "install"
        elif target.is_file() and _is_ours(target):
            same = target.read_bytes() == (source / name).read_bytes()
            action = "unchanged" if same else "replace"
        else:
            raise RefusedError(
                f"{target} exists and is not one of guardctl's hook scripts: "
                "not overwriting it (choose another --prefix)"
            )
        copies.append(Copied(name, target, action))
    return copies


def install(prefix: Path) -> list[Copied]:
    """Copy the scripts into *prefix* (created if missing), each replaced atomically."""
    copies = plan(prefix)
    source = source_dir()
    try:
        prefix.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as exc:
        raise StoreError(f"{prefix}: cannot create: {exc.strerror}") from None
    for copy in copies:
        if copy.action != "unchanged":
            atomic_write(copy.target, (source / copy.name).read_bytes(), mode=0o755)
        os.chmod(copy.target, 0o755)
    return copies


def read_conf(path: Path) -> dict[str, list[str]]:
    """The values of each key of *path* (keys lower-cased; a key may appear on several lines).

    Only the first ``key=value`` of a line is read: the hook keys stand alone on their lines.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise ConfigError(f"--slurm-conf {path}: cannot read: {exc.strerror}") from None
    found: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            found.setdefault(key.strip().lower(), []).append(
                value.split()[0] if value.split() else ""
            )
    return found


def merged_flags(site: list[str]) -> tuple[str, str]:
    """The PrologFlags line and a note: the site's flags kept, Alloc added where needed."""
    flags = [f for value in site[-1:] for f in value.split(",") if f]  # the last line wins
    if {f.lower() for f in flags} & AT_ALLOCATION:
        return "", (
            f"PrologFlags={','.join(flags)} already runs the prolog at allocation: no change"
        )
    line = "PrologFlags=" + ",".join(["Alloc", *flags])
    return line, (
        "your PrologFlags with Alloc added: replace your line with this one"
        if flags
        else "the prolog runs at allocation, on every node of the job"
    )


def conf_lines(prefix: Path, site: dict[str, list[str]] | None) -> list[str]:
    """The slurm.conf lines to merge for scripts in *prefix*, given the site's (or None)."""
    site = site or {}
    lines = []
    flags, note = merged_flags(site.get("prologflags", []))
    lines.append(f"# {note}")
    if flags:
        lines.append(flags)
    for key, script in HOOK_KEYS.items():
        ours = str(prefix / script)
        theirs = [v for v in site.get(key.lower(), []) if v]
        if ours in theirs:
            lines.append(f"# {key}={ours} is set already: no change")
        elif theirs:
            lines.append(
                f"# {key}={', '.join(theirs)} is the site's: keep it and chain "
                "guardctl's with it (docs/operate/upgrade-uninstall.md):"
            )
            lines.append(f"#{key}={ours}")
        else:
            lines.append(f"{key}={ours}")
    for key, value in HEALTH_DEFAULTS.items():
        if site.get(key.lower()):
            lines.append(f"# {key}={site[key.lower()][-1]} is the site's: kept")
        else:
            lines.append(f"{key}={value}")
    return lines
