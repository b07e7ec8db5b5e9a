"""Where `guardctl dds serve` says what happens: details to the log, one line to the terminal.

The service runs in a job's step with its stderr in the job's output: a
traceback there (from a fault in a handler, the event loop or a thread) hides
what an operator needs and looks like a crash when the service carries on.
So every record goes to the job's ``service.log`` (with tracebacks, for
whoever debugs it), and warnings and errors to stderr as one line each.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

FILE_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"


class NotQuiet(logging.Filter):
    """Lets through what is not marked ``extra={"quiet": True}`` (said on the terminal already)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "quiet", False)


class OneLine(logging.Formatter):
    """A record's message on one line, without its traceback (that is in the log file)."""

    def format(self, record: logging.LogRecord) -> str:
        message = " ".join(record.getMessage().split())
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message += f" ({type(exc).__name__}: {' '.join(str(exc).split())})"
        return f"guardctl dds: {record.levelname.lower()}: {message}"


def log_to(path: Path) -> logging.Handler | None:
    """Send the service's records to *path* and, one line each from WARNING, to stderr.

    Returns the file's handler (None if the file cannot be opened: then stderr alone,
    which the caller reports). Threads' uncaught exceptions are logged the same way.
    """
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setLevel(logging.WARNING)
    terminal.setFormatter(OneLine())
    terminal.addFilter(NotQuiet())
    root.addHandler(terminal)
    threading.excepthook = _thread_died
    try:
        handler: logging.Handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        logging.getLogger("guardctl.dds").warning("cannot write the log %s: %s", path, exc)
        return None
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    root.addHandler(handler)
    return handler


def _thread_died(args: threading.ExceptHookArgs) -> None:
    name = args.thread.name if args.thread is not None else "a thread"
    error = args.exc_value if args.exc_value is not None else args.exc_type()
    logging.getLogger("guardctl.dds").error("%s stopped on an error", name, exc_info=error)
