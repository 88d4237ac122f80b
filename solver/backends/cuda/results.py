"""What the CUDA kernels return: a ``Solution`` for the plain kernel, a
:class:`SensitivitySolution` (one row per thread) for the sensitivity kernel."""
from __future__ import annotations

import numpy as np

from ...problem.solution import Solution
from ...problem.status import Status

__all__ = ["kernel_solution", "SensitivitySolution", "keep_states"]


def keep_states(a, states) -> np.ndarray:
    """``a``'s entries at ``states`` (indices into its last axis) as a compact host array (all
    of ``a`` with None)."""
    return a if states is None else np.ascontiguousarray(np.asarray(a)[..., list(states)])


def kernel_solution(ys, t, status, nacc, nrej, backend, info) -> Solution:
    return Solution(ys=ys, status=np.asarray(status, dtype=np.int32), t_final=t,
                    n_accepted=np.asarray(nacc), n_rejected=np.asarray(nrej), backend=backend,
                    info=info)


class SensitivitySolution:
    """Result of a sensitivity-kernel launch (on the GPU or emulated).

    ys (N, ns, n): the states (from each trajectory's direction-0 thread); dys (m, N, ns, n): the
    sensitivities s_d at the save times; status, t_final, n_accepted, n_rejected: (m, N), one per
    thread (direction, trajectory); info: launch diagnostics.
    """

    def __init__(self, ys, dys, status, t_final, n_accepted, n_rejected, backend, info):
        self.ys, self.dys, self.status, self.t_final = ys, dys, status, t_final
        self.n_accepted, self.n_rejected = n_accepted, n_rejected
        self.backend, self.info = backend, info
        self._unreached = None

    def trajectory_status(self) -> np.ndarray:
        """(N,): OK where every direction of the trajectory finished, else the first failed
        direction's status (a failed (i, d) fails trajectory i)."""
        st = np.asarray(self.status)
        bad = st != int(Status.OK)
        first = np.argmax(bad, axis=0)
        return np.where(bad.any(axis=0), st[first, np.arange(st.shape[1])], int(Status.OK))

    def unreached(self) -> np.ndarray:
        """(N, ns): the save times some direction of that trajectory did not reach (NaN in its
        dys). Only the trajectories with a failed direction are searched: a finished thread
        wrote finite values at every save time (the kernels check each step's finiteness), and
        dys can be gigabytes (the CMB sources' Jacobian)."""
        if self._unreached is None:
            dys = np.asarray(self.dys)
            out = np.zeros(dys.shape[1:3], bool)
            failed = np.nonzero(np.any(np.asarray(self.status) != int(Status.OK), axis=0))[0]
            if failed.size:
                out[failed] = np.any(np.isnan(dys[:, failed]), axis=(0, 3))
            self._unreached = out
        return self._unreached

    def dys_or_nan(self) -> np.ndarray:
        """dys with every direction NaN at the save times some direction of that trajectory did
        not reach (as the JAX backend's joint solve of all directions at once reports); dys
        itself, not a copy, when every save time was reached."""
        unreached = self.unreached()
        if not unreached.any():
            return np.asarray(self.dys)
        dys = np.array(self.dys)
        dys[:, unreached] = np.nan
        return dys

    def ys_or_nan(self) -> np.ndarray:
        """ys (the direction-0 threads' states) NaN where ``dys_or_nan`` is: a trajectory's
        values are only as complete as its slowest direction."""
        unreached = self.unreached()
        if not unreached.any():
            return np.asarray(self.ys, np.float64)
        ys = np.array(self.ys, np.float64)
        ys[unreached] = np.nan
        return ys
