"""The batch's progress line: rows done, failures, rate and time left.

It is ``boltzmann.progress.ProgressReporter`` (same stream, the same in-place line on a
terminal, the same ``close``) with a line that answers what a long batch's owner asks: how fast
and until when. The rate counts only this run's rows since its first finished chunk, because the
first chunk carries the compilation and would make every later estimate too pessimistic. In a
log (not a terminal) a line is written at every 10 % and at least every ``log_every_s`` seconds,
so a multi-day log shows signs of life without growing large.
"""
from __future__ import annotations

import time
from typing import Callable, TextIO

from ..progress import ProgressReporter

__all__ = ["BatchProgress", "format_duration"]


def format_duration(seconds: float) -> str:
    """'45 s', '3 min 20 s', '2 h 05 min', '3 d 4 h'."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


class BatchProgress(ProgressReporter):
    """``rows(done, failed)`` after every chunk; ``done`` counts rows finished in the file."""

    def __init__(self, total: int, *, stream: TextIO | None = None,
                 enabled: bool = True, interactive: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter, log_every_s: float = 60.0):
        super().__init__(stream=stream, enabled=enabled, interactive=interactive, clock=clock)
        self.total = int(total)
        self.log_every_s = float(log_every_s)
        self._t0 = clock()
        self._first: tuple[float, int] | None = None
        self._printed_at = (-1.0, -1.0)     # (time, fraction) of the last log line

    def rate(self, done: int) -> float | None:
        """Rows per second of this run after its first chunk (None before a second chunk)."""
        now = self._clock()
        if self._first is None:
            self._first = (now, done)
            return None
        t_first, done_first = self._first
        if done <= done_first or now <= t_first:
            return None
        return (done - done_first) / (now - t_first)

    def line(self, done: int, failed: int) -> str:
        total = max(self.total, 1)
        elapsed = self._clock() - self._t0
        rate = self.rate(done)
        text = (f"batch: {done}/{self.total} rows ({100 * done / total:5.1f}%), "
                f"{failed} failed, {format_duration(elapsed)}")
        if rate is not None:
            text += (f", {rate:.3g} rows/s, "
                     f"ETA {format_duration((self.total - done) / rate)}")
        elif done < self.total:
            text += ", ETA after the first chunks"
        return text

    def rows(self, done: int, failed: int) -> None:
        text = self.line(done, failed)
        self._last["batch"] = self._clock()
        self._start.setdefault("batch", self._t0)
        if not self.enabled:
            return
        finished = done >= self.total
        if self.interactive:
            self.stream.write("\r" + text + "\x1b[K")
            self._open_line = True
            if finished:
                self._end_line()
        else:
            now, fraction = self._clock(), done / max(self.total, 1)
            t_last, f_last = self._printed_at
            if finished or f_last < 0 or fraction - f_last >= 0.1 \
                    or now - t_last >= self.log_every_s:
                self.stream.write(text + "\n")
                self._printed_at = (now, fraction)
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line of its own (setup, warnings), ending an in-place line first."""
        if not self.enabled:
            return
        self._end_line()
        self.stream.write(text + "\n")
        self.stream.flush()
