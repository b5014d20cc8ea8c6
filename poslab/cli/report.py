"""``poslab report [--out DIR] [--lang en|zh] [--html FILE]``: rebuild the lab's page from existing results.

Exit 1 (after writing the page) when a key table cannot be built from its results, one line on stderr for each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from poslab.cli import paths
from poslab.lab.report import build_report
from poslab.lab.report.builder import table_failures
from poslab.lab.report.i18n import LANGS


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="rebuild the lab's report page from the results it holds (no experiment runs)",
        description="Rebuild LAB/report.html (English) or LAB/report.zh.html (简体中文) from "
        "the results.json files and figures of a lab folder.",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/lab"), help="lab folder (default runs/lab)")
    parser.add_argument("--lang", choices=LANGS, default="en", help="language of the page (default en; zh: 简体中文)")
    parser.add_argument(
        "--html",
        type=Path,
        default=None,
        help="page to write (default LAB/report.html, or LAB/report.zh.html for --lang zh)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.out.is_dir():
        raise ValueError(f"--out {str(args.out)!r} is not a lab folder; run `poslab lab --out {args.out}` first")
    paths.output_file(args.html, "--html")
    print(f"wrote {build_report(args.out, args.html, lang=args.lang)}")
    failures = table_failures(args.out)
    for failure in failures:  # the page shows each in the table's place; the exit status says the page is partial
        print(f"poslab report: error: {failure.line()}", file=sys.stderr)
    return 1 if failures else 0
