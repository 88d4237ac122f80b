"""Progress reporting for long pipeline stages.

The pipeline calls ``progress(stage, done, total)`` as work completes (e.g. per batch of k modes).
`ProgressReporter` prints to stderr: one line rewritten in place (carriage return) when stderr is a
terminal, plain lines at most every ~10% (and at a stage's start and end) otherwise, so logs stay
short. It also records each stage's wall time, from its first to its last report.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

__all__ = ["ProgressReporter", "ProgressCallback", "null_progress", "format_timings"]

ProgressCallback = Callable[[str, int, int], None]


def null_progress(stage: str, done: int, total: int) -> None:
    """A progress callback that does nothing."""


def format_timings(timings: dict[str, float]) -> str:
    """One line per stage, 'stage  1.234 s', plus the total."""
    if not timings:
        return ""
    width = max(len(stage) for stage in timings)
    lines = [f"  {stage:<{width}}  {seconds:8.3f} s" for stage, seconds in timings.items()]
    lines.append(f"  {'total':<{width}}  {sum(timings.values()):8.3f} s")
    return "\n".join(lines)


class ProgressReporter:
    """Callable ``(stage, done, total)`` progress sink; see module docstring."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True, interactive: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        self._clock = clock
        self._start: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._last_printed_fraction: dict[str, float] = {}
        self._open_line = False
        self._current: str | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self._clock()
        if stage not in self._start:
            if self._current is not None and self._current != stage:
                self._end_line()
            self._start[stage] = now
            self._last_printed_fraction[stage] = -1.0
        self._current = stage
        self._last[stage] = now
        if not self.enabled:
            return
        total = max(int(total), 1)
        done = min(max(int(done), 0), total)
        fraction = done / total
        elapsed = now - self._start[stage]
        text = f"{stage}: {done}/{total} ({100 * fraction:5.1f}%) {elapsed:7.1f} s"
        if self.interactive:
            self.stream.write("\r" + text + "\x1b[K")
            self._open_line = True
            if done == total:
                self._end_line()
        else:
            previous = self._last_printed_fraction[stage]
            if done == total or previous < 0 or fraction - previous >= 0.1:
                self.stream.write(text + "\n")
                self._last_printed_fraction[stage] = fraction
        self.stream.flush()

    def _end_line(self) -> None:
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False

    def close(self) -> None:
        """Terminate a pending in-place line."""
        self._end_line()

    @property
    def timings(self) -> dict[str, float]:
        """Wall seconds per stage between its first and last report."""
        return {stage: self._last[stage] - self._start[stage] for stage in self._start}
