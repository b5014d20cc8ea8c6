"""The ``poslab`` command line (also ``python -m poslab``).

Each subcommand lives in its own module exposing ``add_parser(subparsers)``; adding a command is one
line in :data:`COMMANDS`. A command line naming a command imports that command's module only (the
lab's and the explorer's imports stay out of ``poslab train``'s start-up); anything else (``--help``,
``--version``, a misspelt command) builds the whole parser. Bad input prints one line
``poslab: error: ...`` and exits 2, never a traceback.

Signals: SIGTERM (what schedulers, ``timeout`` and ``kill`` send) and SIGHUP (a closed terminal,
unless ignored, e.g. by ``nohup``) act as Ctrl-C: a training finishes its step, saves a checkpoint
and exits 130 with one line ``poslab: interrupted by SIGTERM`` (a command that continues what it
saved when run again, as ``lab`` and ``experiment``, says so: its ``on_interrupt`` default). A
command started by a sweep (``POSLAB_PARENT_PID`` set) gets SIGTERM when that parent dies, however
it dies (``PR_SET_PDEATHSIG`` on Linux, else a watcher thread).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

from poslab.fileio import stdout_errors

# one line per subcommand module; each registers the command its last name part names
COMMANDS = (
    "poslab.cli.experiment",
    "poslab.cli.train",
    "poslab.cli.sample",
    "poslab.cli.presets",
    "poslab.cli.bench",
    "poslab.cli.convert",
    "poslab.cli.average",
    "poslab.cli.eval",
    "poslab.cli.lab",
    "poslab.cli.report",
    "poslab.cli.heads",
    "poslab.cli.attention",
    "poslab.cli.explore",
    "poslab.cli.sweep",
    "poslab.cli.check",
)


class UsageError(Exception):
    """A user error detected by a command: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too; keep it short)
        self.exit(2, f"poslab: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``poslab`` parser: with ``command`` (one of :data:`COMMANDS`' names) that command's only, else all."""
    parser = _Parser(prog="poslab", description="poslab: multi-head attention and position encodings lab")
    parser.add_argument("--version", action="version", version=f"poslab {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in [m for m in COMMANDS if m.rpartition(".")[2] == command] or COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return parser


def _version() -> str:
    from poslab.version import __version__

    return __version__


_PR_SET_PDEATHSIG = 1


#: the signal that stopped the command (``None``: Ctrl-C, or none)
_stopped_by: str | None = None


def _as_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM / SIGHUP -> whatever Ctrl-C does now (the trainer's save-and-stop flag, else KeyboardInterrupt)."""
    global _stopped_by
    _stopped_by = signal.Signals(signum).name
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job) or default: still stop
        raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_as_ctrl_c() -> Iterator[None]:
    """Route SIGTERM (and SIGHUP unless it is ignored) to the Ctrl-C path for the command's duration."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is None or signal.getsignal(sig) is signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, _as_ctrl_c)
    try:
        _follow_parent()
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _follow_parent() -> None:
    """When :data:`PARENT_ENV` names our parent, receive SIGTERM as soon as it dies."""
    from poslab.jobs.sweep import PARENT_ENV  # set by the sweep to its pid

    text = os.environ.pop(PARENT_ENV, None)
    if not text or not text.isdigit():
        return
    parent = int(text)
    armed = False
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    if os.getppid() != parent:  # it died before we armed: stop now
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if not armed:

        def watch() -> None:
            while os.getppid() == parent:
                threading.Event().wait(1.0)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="poslab-parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    with _signals_as_ctrl_c():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with stdout_errors():  # output redirected to a full disk: one line naming the file, not a traceback at exit
            result = args.func(args)
    except (UsageError, ValueError, TypeError, FileNotFoundError, FileExistsError, PermissionError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"poslab: error: {message}", file=sys.stderr)
        return 2
    except OSError as err:  # disk full, read-only file system, I/O error: the machine, not the input
        where = f": {err.filename!r}" if err.filename else ""
        message = f"{err.strerror}{where}" if err.strerror else (str(err).splitlines() or [type(err).__name__])[0]
        print(f"poslab: error: {message}", file=sys.stderr)
        return 1
    except (MemoryError, RuntimeError) as err:
        if not isinstance(err, MemoryError) and "can't allocate memory" not in str(err):
            raise  # a bug: keep the traceback
        needed = re.search(r"allocate (\d+) bytes", str(err))
        size = f" ({int(needed.group(1)) / 2**30:,.1f} GiB requested)" if needed else ""
        print(f"poslab: error: out of memory{size}; use a smaller model or batch", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        by = f" by {_stopped_by}" if _stopped_by else ""
        print(f"poslab: interrupted{by}{getattr(args, 'on_interrupt', '')}", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
