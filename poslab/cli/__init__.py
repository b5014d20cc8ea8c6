"""The ``poslab`` command line: one thin module per command (argument parsing, then a call below)."""

from poslab.cli.app import main

__all__ = ["main"]
