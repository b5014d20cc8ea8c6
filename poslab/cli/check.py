"""``poslab check list | NAME FILE.py | NAME --template``: exercises that check themselves.

``poslab check NAME FILE.py`` executes FILE.py (the student's own code), calls its function on fixed
random cases and compares it with poslab's implementation: exit 0 when every case matches, 1 with
the first failing case, 2 when the file or the function cannot be run (one line).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from poslab.lab.exercises import EXERCISES, check, get


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "check",
        help="check a lesson exercise you wrote (`poslab check list`; `poslab check NAME FILE.py`)",
        description="Check your solution of a lesson exercise: FILE.py is executed (it is your own code), "
        "its function is called on fixed random cases and compared with poslab's implementation. "
        "Exit 0: right; 1: wrong (the first failing case is named); 2: the file or function cannot be run.",
    )
    parser.add_argument("name", metavar="NAME", help="an exercise (`list` shows them)")
    parser.add_argument("file", metavar="FILE.py", type=Path, nargs="?", help="your solution")
    parser.add_argument("--template", action="store_true", help="print a starter file for NAME and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name == "list":
        for e in EXERCISES.values():
            print(f"{e.name:<12}  {e.function}({e.signature})  [课文 {e.lesson}]")
            print(f"{'':<12}  {e.task_en}")
        return 0
    exercise = get(args.name)
    if args.template:
        print(exercise.template(), end="")
        return 0
    if args.file is None:
        raise ValueError(
            f"give the file with your {exercise.function}: `poslab check {exercise.name} FILE.py` "
            f"(a starter: `poslab check {exercise.name} --template > FILE.py`)"
        )
    result = check(exercise, args.file)
    if result.right:
        print(f"正确 / right: {result.message}")
        return 0
    print(f"错误 / wrong: {result.message}")
    return 1
