"""The result of an ensemble solve, the same type from every backend."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .status import Status, describe

__all__ = ["Solution"]


@dataclass
class Solution:
    """Result of an ensemble solve.

    ys: (N, n_save, n) state at the save times (NaN where a failed trajectory never got);
    status: (N,) Status codes; t_final: (N,) time each trajectory reached;
    n_accepted / n_rejected: (N,) step counters; backend: which backend ran;
    info: what the backend reports about this solve (linear solver, colours, and for the CUDA
    backend the launch: kernel seconds, compile and cache details, local memory per thread).
    """

    ys: Any
    status: np.ndarray
    t_final: Any
    n_accepted: np.ndarray
    n_rejected: np.ndarray
    backend: str
    info: dict = field(default_factory=dict)

    @property
    def ok(self) -> np.ndarray:
        return np.asarray(self.status) == Status.OK

    def failures(self) -> list[tuple[int, str]]:
        """(trajectory index, reason) for every trajectory that did not finish."""
        st = np.asarray(self.status)
        return [(int(i), describe(st[i])) for i in np.flatnonzero(st != Status.OK)]

    def stats(self) -> dict:
        acc = np.asarray(self.n_accepted)
        rej = np.asarray(self.n_rejected)
        return {
            "backend": self.backend,
            "trajectories": int(acc.size),
            "failed": int(np.sum(~self.ok)),
            "accepted_steps_median": float(np.median(acc)) if acc.size else 0.0,
            "accepted_steps_max": int(acc.max()) if acc.size else 0,
            "rejected_steps_total": int(rej.sum()),
            **self.info,
        }
