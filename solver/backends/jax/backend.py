"""The JAX backend: the ensemble loop of ``ensemble.py`` on whatever device JAX runs (CPU in CI,
a GPU as the baseline the CUDA backend is measured against)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ...problem.solution import Solution
from ..base import Backend
from .ensemble import DEFAULT_LANES, lane_option
from .joint import h0, joint_run, plain_plan
from .plan import get_plan

__all__ = ["JaxBackend"]


class JaxBackend(Backend):
    """``backend="jax"``. ``stats`` counts the work of forward-sensitivity solves:
    ``joint_traces`` (joint solves traced or run eagerly), ``joint_plans`` (joint plans built)
    and ``pattern_seconds`` (time spent detecting the joint Jacobian's coupling pattern), so a
    caller can tell that an undifferentiated ``solve_diff`` never touched them."""

    name = "jax"

    def __init__(self, lanes: int | str | None = DEFAULT_LANES):
        self.stats = {"joint_traces": 0, "joint_plans": 0, "pattern_seconds": 0.0}
        #: trajectories advanced together, a finished one's lane taking the next waiting
        #: (None, the default: all in lock-step; "auto": ``ensemble.auto_lanes``;
        #: ``ensemble.make_ensemble_solver``)
        self.lanes = lane_option(lanes)

    def solve(self, rhs, inputs, *, args, rtol, max_steps, sparsity, linear_solver, controller,
              tableau):
        y0, params, ts, t0a, tea, atol_a, w, first = inputs
        plan = get_plan(rhs, y0.shape[1], params.shape[1], args is not None, args, sparsity,
                        linear_solver, tableau, controller, max_steps, lanes=self.lanes)
        res = plan.run(jnp.asarray(y0), jnp.asarray(t0a), jnp.asarray(tea), jnp.asarray(ts),
                       jnp.asarray(params), args, jnp.float64(rtol), jnp.asarray(atol_a),
                       jnp.asarray(w), jnp.asarray(first))
        return Solution(ys=res.ys, status=np.asarray(res.status), t_final=res.t,
                        n_accepted=np.asarray(res.n_accepted),
                        n_rejected=np.asarray(res.n_rejected), backend=self.name,
                        info={"linear_solver": plan.linear.method,
                              "jacobian": plan.jacobian,
                              "jacobian_colors": int(plan.n_colors)})

    def check_sensitivities(self, spec) -> None:
        """Any RHS the JAX backend solves, it differentiates."""

    def solve_ys(self, spec, y0, params, args, ts, t0, te):
        plan = plain_plan(spec, args, self.lanes)
        res = plan.run(y0, t0, te, ts, params, args if spec.has_args else None,
                       jnp.float64(spec.rtol), jnp.asarray(spec.atol), jnp.asarray(spec.weights),
                       h0(spec, y0.shape[0]))
        return res.ys

    def solve_sensitivities(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs):
        res, m = joint_run(spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs,
                           self.stats, self.lanes)
        N, ns, n = y0.shape[0], res.ys.shape[1], spec.n
        return jnp.moveaxis(res.ys[:, :, n:].reshape(N, ns, m, n), 2, 0)

    def solve_with_sensitivities(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp,
                                 dargs, states=None):
        """The joint solve's own y beside the sensitivities: no separate plain solve."""
        res, m = joint_run(spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs,
                           self.stats, self.lanes)
        N, ns, n = y0.shape[0], res.ys.shape[1], spec.n
        dys = jnp.moveaxis(res.ys[:, :, n:].reshape(N, ns, m, n), 2, 0)
        ys = res.ys[:, :, :n]
        if states is None:
            return ys, dys
        return ys[..., np.asarray(states)], dys[..., np.asarray(states)]

    def joint_solve(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs):
        res, m = joint_run(spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs,
                           self.stats, self.lanes)
        N, ns, n = y0.shape[0], res.ys.shape[1], spec.n
        dys = jnp.moveaxis(res.ys[:, :, n:].reshape(N, ns, m, n), 2, 0)
        info = {"status": np.asarray(res.status), "n_accepted": np.asarray(res.n_accepted),
                "n_rejected": np.asarray(res.n_rejected)}
        return res.ys[:, :, :n], dys, info
