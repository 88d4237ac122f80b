"""Per-trajectory outcome codes shared by every backend.

A trajectory never returns silent garbage: if it stops before its end time the code says why, and
its saved values past that point are NaN.
"""
from __future__ import annotations

import enum


class Status(enum.IntEnum):
    OK = 0               #: reached its end time
    MAX_STEPS = 1        #: ran out of step attempts (max_steps)
    STEP_TOO_SMALL = 2   #: the controller asked for a step below the floor (stiffness/singularity)
    NON_FINITE = 3       #: the RHS or the step produced NaN/inf and shrinking the step did not help
    RUNNING = -1         #: internal: not finished yet


def describe(code: int) -> str:
    """Human-readable name of a status code (for error messages)."""
    try:
        return Status(int(code)).name.lower()
    except ValueError:
        return f"unknown status {code}"
