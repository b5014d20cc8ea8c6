"""Grade a student's file: load it, call the named function on every case, compare with the reference.

The student's file is executed (``importlib``), as ``python FILE.py`` would execute it: it is the
student's own code. A file that cannot be loaded, a missing function, a signature that cannot take a
case's arguments, or an exception inside the function is a :class:`SolutionError` (one line, exit 2
in the CLI); an output of the wrong shape or values is a wrong answer naming the first failing case.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from poslab.lab.exercises.base import Case, Exercise

SEED = 0  # the cases are the same on every run: a failure names a case the student can rerun
_counter = itertools.count()


class SolutionError(ValueError):
    """The student's file or function could not be run on a case (one line)."""


@dataclass(frozen=True)
class CheckResult:
    """``right`` with the number of cases passed, or the first failing case's one-line description."""

    right: bool
    cases: int
    message: str


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def load_function(path: Path, name: str) -> Callable[..., Any]:
    """Execute the file at ``path`` as a fresh module and return its function ``name``."""
    if not path.is_file():
        raise SolutionError(f"no such file: {str(path)!r}")
    spec = importlib.util.spec_from_file_location(f"poslab_exercise_{next(_counter)}", path)
    if spec is None or spec.loader is None:
        raise SolutionError(f"{str(path)!r} is not a Python file (name it *.py)")
    module: ModuleType = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # the student's code: any failure is reported in one line
        where = f" (line {err.lineno})" if isinstance(err, SyntaxError) and err.lineno else ""
        raise SolutionError(f"{path.name} does not load{where}: {_one_line(err)}") from None
    function = getattr(module, name, None)
    if function is None:
        raise SolutionError(f"{path.name} defines no function {name!r}")
    if not callable(function):
        raise SolutionError(f"{name!r} in {path.name} is a {type(function).__name__}, not a function")
    return function


def _clone(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _call(function: Callable[..., Any], case: Case, k: int, name: str) -> Tensor:
    try:
        inspect.signature(function).bind(*case.args)
    except TypeError as err:
        raise SolutionError(f"{name} cannot take case {k}'s {len(case.args)} arguments: {err}") from None
    except ValueError:  # a builtin without a signature: just call it
        pass
    try:
        out = function(*_clone(case.args))
    except (Exception, SystemExit) as err:  # the student's code: report the exception type and message, one line
        raise SolutionError(f"case {k} ({case.label}): {name} raised {_one_line(err)}") from None
    try:
        return torch.as_tensor(out)
    except Exception as err:
        raise SolutionError(
            f"case {k} ({case.label}): {name} returned {type(out).__name__}, not a tensor ({_one_line(err)})"
        ) from None


def compare(exercise: Exercise, want: Tensor, got: Tensor, k: int, case: Case) -> str | None:
    """``None`` when ``got`` matches ``want`` within the exercise's tolerance, else the one-line reason."""
    head = f"case {k} ({case.label})"
    if want.dim() == 0 and got.numel() == 1:
        got = got.reshape(())
    if got.shape != want.shape:
        return f"{head}: shape {list(got.shape)}, expected {list(want.shape)}"
    if want.dtype == torch.bool:
        got = got != 0  # a mask may come as bool, 0/1 ints or floats: nonzero = attend
    if exercise.view is not None:
        want, got = exercise.view(want), exercise.view(got)
    want64, got64 = want.to(torch.float64), got.detach().to(torch.float64)
    diff = (got64 - want64).abs()
    bad = ~(diff <= exercise.atol + exercise.rtol * want64.abs())  # NaN counts as bad
    if not bool(bad.any()):
        return None
    where = tuple(int(i) for i in torch.unravel_index(bad.flatten().nonzero()[0, 0], want.shape))
    finite = diff[~diff.isnan()]
    worst = f"{float(finite.max()):.2e}" if finite.numel() else "nan"
    at = f" at index {list(where)}" if where else ""
    return (
        f"{head}: max |diff| {worst}; first differs{at}: expected {float(want64[where]):.6g}, "
        f"got {float(got64[where]):.6g} (tolerance atol {exercise.atol:g}, rtol {exercise.rtol:g})"
    )


def check(exercise: Exercise, path: Path, seed: int = SEED) -> CheckResult:
    """Run the function ``exercise.function`` of the file at ``path`` on every case of ``exercise``."""
    function = load_function(path, exercise.function)
    cases = exercise.cases(seed)
    for k, case in enumerate(cases, start=1):
        with torch.no_grad():
            want = exercise.reference(*_clone(case.args))
        got = _call(function, case, k, exercise.function)
        reason = compare(exercise, want, got, k, case)
        if reason is not None:
            return CheckResult(False, k - 1, f"{reason} [seed {seed}]")
    return CheckResult(True, len(cases), f"{len(cases)} cases")
