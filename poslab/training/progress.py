"""A dependency-free live progress line on stderr (step, loss, val loss, tokens/s, ETA).

On a terminal the line is redrawn in place (``\\r``); when stderr is a file or a pipe (CI, ``nohup``)
a plain line is printed at most every ``min_interval_s`` seconds and on every evaluation, so logs
stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_duration(seconds: float) -> str:
    """``75 -> '1m15s'``, ``3725 -> '1h02m'``."""
    if seconds != seconds or seconds < 0:  # NaN
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def format_rate(tokens_per_s: float) -> str:
    """``21345.6 -> '21.3k'``."""
    if tokens_per_s >= 1e6:
        return f"{tokens_per_s / 1e6:.2f}M"
    if tokens_per_s >= 1e3:
        return f"{tokens_per_s / 1e3:.1f}k"
    return f"{tokens_per_s:.0f}"


class ProgressBar:
    """Progress of a training run from ``start_step`` to ``total_steps``.

    Args:
        total_steps: the last step.
        start_step: the step the run (re)starts from (ETA counts only the steps run here).
        stream: where to draw (default ``sys.stderr``).
        enabled: draw nothing when False (``summary`` still prints).
        width: bar width in characters.
        min_interval_s: minimum seconds between redraws.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        stream: TextIO | None = None,
        enabled: bool = True,
        width: int = 20,
        min_interval_s: float = 0.2,
    ) -> None:
        self.total_steps = total_steps
        self.start_step = start_step
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.width = width
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval_s = min_interval_s if self.interactive else max(min_interval_s, 10.0)
        self.started = time.perf_counter()
        self.last_draw = 0.0
        self.loss: float | None = None
        self.val_loss: float | None = None
        self.tokens_per_s: float | None = None
        self._dirty_line = False

    def line(self, step: int) -> str:
        """The progress text for ``step`` (without control characters)."""
        fraction = step / self.total_steps if self.total_steps else 1.0
        filled = int(round(fraction * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.perf_counter() - self.started
        done_here = step - self.start_step
        eta = elapsed / done_here * (self.total_steps - step) if done_here > 0 else float("nan")
        parts = [f"step {step:>{len(str(self.total_steps))}}/{self.total_steps} [{bar}] {100 * fraction:3.0f}%"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.val_loss is not None:
            parts.append(f"val {self.val_loss:.4f}")
        if self.tokens_per_s is not None:
            parts.append(f"{format_rate(self.tokens_per_s)} tok/s")
        parts.append(f"ETA {format_duration(eta)}")
        return " | ".join(parts)

    def update(
        self,
        step: int,
        loss: float | None = None,
        val_loss: float | None = None,
        tokens_per_s: float | None = None,
        force: bool = False,
    ) -> None:
        """Record the newest figures and redraw if due (``force``: always, e.g. after an evaluation)."""
        if loss is not None:
            self.loss = loss
        if val_loss is not None:
            self.val_loss = val_loss
        if tokens_per_s is not None:
            self.tokens_per_s = tokens_per_s
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last_draw < self.min_interval_s and step != self.total_steps:
            return
        self.last_draw = now
        text = self.line(step)
        if self.interactive:
            self.stream.write("\r\033[K" + text)
            self._dirty_line = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        """Print a full line without garbling the live bar."""
        self._end_line()
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, summary: str | None = None) -> None:
        """Finish the bar's line and print ``summary`` (always, even when drawing is disabled)."""
        self._end_line()
        if summary:
            self.stream.write(summary + "\n")
            self.stream.flush()

    def _end_line(self) -> None:
        if self._dirty_line:
            self.stream.write("\n")
            self._dirty_line = False
