"""The interface every backend implements.

A backend integrates an ensemble with the shared method and linear algebra on one kind of
hardware. The entry points validate inputs and resolve the backend (``solver.backends.registry``)
and then talk to it only through these methods:

* ``solve``: one eager ensemble solve of validated inputs, returning a ``Solution``;
* ``solve_ys``: the saved states only, as a JAX computation (the undifferentiated value inside
  ``solve_diff``; its inputs may be tracers);
* ``solve_sensitivities``: the forward sensitivities for m tangent directions, (m, N, n_save, n),
  as a JAX computation (the tangent of ``solve_diff``);
* ``joint_solve``: states, sensitivities and per-trajectory diagnostics, eagerly;
* ``check_sensitivities``: refuse, with the reason, a differentiable solve the backend cannot do.

The sensitivity methods take a :class:`~solver.problem.SensitivitySpec` (the static settings) and
a ``mask`` = (y0 differentiated, params differentiated, indices of differentiated args leaves);
``dy0`` (m, N, n), ``dp`` (m, N, P) are None when not differentiated, ``dargs`` is a tuple with one
(m, *leaf.shape) array per differentiated leaf.
"""
from __future__ import annotations

import abc

__all__ = ["Backend"]


class Backend(abc.ABC):
    """One way to run the ensemble solve; see the module docstring for the contract."""

    #: what ``Solution.backend`` reports
    name: str = "?"

    @abc.abstractmethod
    def solve(self, rhs, inputs, *, args, rtol, max_steps, sparsity, linear_solver, controller,
              tableau):
        """``inputs``: :class:`~solver.problem.ValidatedInputs`. Returns a ``Solution``."""

    @abc.abstractmethod
    def check_sensitivities(self, spec) -> None:
        """Raise if this backend cannot differentiate a solve with these settings."""

    @abc.abstractmethod
    def solve_ys(self, spec, y0, params, args, ts, t0, te):
        """(N, n_save, n) saved states; traceable."""

    @abc.abstractmethod
    def solve_sensitivities(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs):
        """(m, N, n_save, n) sensitivities at the save times; traceable."""

    @abc.abstractmethod
    def joint_solve(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs):
        """Eager: (ys (N, ns, n), dys (m, N, ns, n), info dict with at least ``status``,
        ``n_accepted`` and ``n_rejected`` per trajectory)."""

    def solve_with_sensitivities(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp,
                                 dargs, states=None):
        """(ys (N, n_save, n), dys (m, N, n_save, n)) from one traced solve, or None where the
        backend has no such solve (then ``solver.solve_with_tangents`` runs the plain solve and
        ``solve_sensitivities``). ``states`` (increasing indices; None: all): ys and dys hold
        only those states (last axis len(states))."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
