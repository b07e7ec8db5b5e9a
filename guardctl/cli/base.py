"""The root click group, shared options, output helpers and the one error handler."""

from __future__ import annotations

import errno
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from tabulate import tabulate

from guardctl import __version__
from guardctl.config import Settings, load_settings
from guardctl.errors import ExitCode, GuardctlError

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class AppContext:
    """What every command gets: the config layers asked for, and settings loaded once."""

    config_files: tuple[Path, ...] = ()
    assignments: tuple[str, ...] = ()
    debug: bool = False
    _settings: Settings | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config_files, self.assignments)
        return self._settings


pass_app = click.make_pass_decorator(AppContext)


def fail(exc: GuardctlError) -> NoReturn:
    """Print one line for *exc* and exit with its code."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    click.echo(f"guardctl: error: {message}", err=True)
    sys.exit(int(exc.exit_code))


class GuardctlGroup(click.Group):
    """A click group whose invoke turns every foreseen error into one line and an exit code."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # Click's own usage errors span several lines; operators and scripts get one.
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
            sys.exit(int(ExitCode.USAGE))
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "guardctl"
            click.echo(
                f"guardctl: error: {exc.format_message()} (see '{command} --help')", err=True
            )
            sys.exit(int(ExitCode.USAGE))
        except click.ClickException as exc:
            click.echo(f"guardctl: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("guardctl: error: interrupted", err=True)
            sys.exit(130)  # the shell's convention for SIGINT
        sys.exit(result if isinstance(result, int) else int(ExitCode.OK))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GuardctlError as exc:
            fail(exc)
        except BrokenPipeError:
            # `guardctl status | head` must not print a traceback.
            sys.stderr.close()
            sys.exit(int(ExitCode.OK))
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                sys.exit(int(ExitCode.OK))
            if ctx.obj is not None and getattr(ctx.obj, "debug", False):
                raise
            click.echo(f"guardctl: error: {exc}", err=True)
            sys.exit(int(ExitCode.IO))
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except Exception as exc:  # a bug: one line, unless --debug asks for the traceback
            if ctx.obj is not None and getattr(ctx.obj, "debug", False):
                raise
            click.echo(
                f"guardctl: error: internal error ({type(exc).__name__}: {exc}); "
                "rerun with --debug for details",
                err=True,
            )
            sys.exit(int(ExitCode.INTERNAL))


@click.group(cls=GuardctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="guardctl")
@click.option(
    "--config",
    "config_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Read this TOML file after /etc/guardctl (repeatable).",
)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override one setting (repeatable), e.g. --set safety.max_out_nodes=4.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks of internal errors.")
@click.pass_context
def main(
    ctx: click.Context, config_files: tuple[Path, ...], assignments: tuple[str, ...], debug: bool
) -> None:
    """Find, prove and handle grey (slow) GPU nodes in a Slurm cluster.

    Exit codes: 0 ok, 1 findings (a suspect or unhealthy node), 2 usage,
    3 config, 4 Slurm command failed, 5 Slurm timeout or the Slurm controller down,
    6 refused by a safety rule, 7 bad input data, 8 store or file not writable,
    70 internal error.
    """
    ctx.obj = AppContext(config_files=config_files, assignments=assignments, debug=debug)


def json_option(func: F) -> F:
    """The ``--json`` flag every read command has."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        func
    )


def dry_run_option(func: F) -> F:
    """The ``--dry-run`` flag every acting command has."""
    return click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")(
        func
    )


def echo_json(data: Any) -> None:
    """Print *data* as indented JSON on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def echo_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    """Print an aligned plain table (tabulate)."""
    click.echo(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
