"""What an exercise is: the function a student writes, the reference it is checked against, the cases."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


@dataclass(frozen=True)
class Case:
    """One call of the student's function: its arguments and a short description naming shapes and values."""

    args: tuple[Any, ...]
    label: str


@dataclass(frozen=True)
class Exercise:
    """A hands-on part of a lesson that ``poslab check`` can grade.

    Attributes:
        name: the CLI name (``apply-rope``).
        lesson: where the lesson asks for it (``000 §3.3``).
        function: the name of the function the student defines.
        signature: its parameters as the student writes them (``x, pos, base=10000``).
        task_zh: what to write, in Chinese (the template's docstring).
        task_en: the same in one English line (``poslab check list``).
        reference: poslab's implementation, called with a case's arguments.
        cases: ``cases(seed)`` -> the cases, shapes varied, edge cases included.
        atol, rtol: an output passes when ``|got - want| <= atol + rtol * |want|`` elementwise (fp32).
        view: applied to both outputs before comparing (e.g. keep only the entries a causal model uses).
        imports: the starter file's import lines.
    """

    name: str
    lesson: str
    function: str
    signature: str
    task_zh: str
    task_en: str
    reference: Callable[..., Tensor]
    cases: Callable[[int], list[Case]]
    atol: float = 1e-5
    rtol: float = 1e-5
    view: Callable[[Tensor], Tensor] | None = None
    imports: tuple[str, ...] = field(default=("import torch",))

    def template(self) -> str:
        """A starter file: the signature, the task as a Chinese docstring, and the command that checks it."""
        doc = "\n".join(f"    {line}" if line else "" for line in self.task_zh.strip().splitlines())
        header = "\n".join(self.imports)
        return (
            f'"""练习：{self.function}（课文 {self.lesson}）。\n\n'
            f"写好函数体后检查：poslab check {self.name} 本文件.py\n"
            '"""\n\n'
            f"{header}\n\n\n"
            f"def {self.function}({self.signature}):\n"
            f'    """{doc.lstrip()}\n    """\n'
            '    raise NotImplementedError("在这里写你的代码")\n'
        )
