"""The ``poslab`` command line (also ``python -m poslab``).

Each subcommand lives in its own module exposing ``add_parser(subparsers)``; adding a command is one
line in :data:`COMMANDS`. Bad input prints one line ``poslab: error: ...`` and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

from poslab.fileio import stdout_errors

# one line per subcommand module
COMMANDS = (
    "poslab.cli.experiment",
    "poslab.cli.train",
    "poslab.cli.sample",
    "poslab.cli.presets",
    "poslab.lab.bench",
    "poslab.interop.convert",
    "poslab.analysis.eval",
    "poslab.lab.lab",
    "poslab.analysis.heads",
    "poslab.analysis.attention_map",
    "poslab.lab.explore",
    "poslab.lab.sweep",
)


class UsageError(Exception):
    """A user error detected by a command: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too; keep it short)
        self.exit(2, f"poslab: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="poslab", description="poslab: multi-head attention and position encodings lab")
    parser.add_argument("--version", action="version", version=f"poslab {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return parser


def _version() -> str:
    from poslab.version import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
        print("poslab: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
