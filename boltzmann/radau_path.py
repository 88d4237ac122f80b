"""Node-to-node Radau IIA integration of a small stiff system, with tangents by linearisation.

The recombination rate equations are integrated over a fixed grid, one 2-stage Radau IIA step
per grid cell (``recombination.radau_step``). The primal has to be a sequential loop; its
derivative does not. Differentiating through the loop (``jax.jvp`` of the scan) carries every
tangent through the step's six Newton iterations, its two Jacobians and its factorisations, node
after node — on the CPU that made the tables' jacfwd in ten parameters seven times the cost of
the tables.

The step's stage increments Z = (Z_1, Z_2) solve  Z_i = h Σ_j A_ij f(t_j, y_n + Z_j, q_j)  (q:
what the rhs reads besides the state — the expansion rate at the stage times, the cosmology's
recombination parameters), and y_{n+1} = y_n + Z_2. Differentiating that equation at the
converged stages (the implicit-function theorem) gives, for every step independently,

    dy_{n+1} = Φ_n dy_n + β_n,   Φ_n = I + [M⁻¹ h (A ⊗ J) E]_2,   β_n = [M⁻¹ h (A ⊗ I) g]_2,

with J_j = ∂f/∂y and g_j = ∂f/∂q · dq_j at stage j, M = I − h (A ⊗ J) the exact stage Jacobian,
and E = (I, I)ᵀ. So :func:`radau_path`'s jvp computes every (Φ_n, β_n) at once, vectorised over
the steps, and the affine recurrence by :func:`affine_recurrence` — an associative scan,
log2(steps) vectorised levels instead of a loop. The Newton iterations are converged to rounding,
so this equals the derivative of the iterated step to the same level.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from boltzmann import recombination as rec
from boltzmann.small_linalg import lu_factor_small, lu_solve_small

__all__ = ["radau_path", "affine_recurrence"]


def affine_recurrence(phi, beta, x0):
    """x_{n+1} = phi_n x_n + beta_n for n = 0 … N−1, returned as x_1 … x_N (N, …).

    ``phi`` (N,) with ``beta`` (N, …) (a scalar recurrence) or (N, m, m) with ``beta`` (N, m);
    an associative scan of the affine maps, so it runs in log2(N) vectorised levels.
    """
    matrix = phi.ndim == 3

    def compose(first, second):
        """The affine map ``second`` after ``first`` (element-wise over the scan's leading axis)."""
        (pa, ba), (pb, bb) = first, second
        if matrix:
            return pb @ pa, jnp.einsum("...ij,...j->...i", pb, ba) + bb
        return pb * pa, pb * ba + bb

    acc_phi, acc_beta = jax.lax.associative_scan(compose, (phi, beta))
    if matrix:
        return jnp.einsum("nij,j->ni", acc_phi, x0) + acc_beta
    return acc_phi * x0 + acc_beta


def _integrate(rhs, t_lo, t_hi, y0, stage_args, params, loops):
    """The sequential primal: (states at t_hi (N, n), stage increments (N, 2, n))."""
    def f(t, y, s):
        return rhs(t, y, s, params)

    def step(y, xs):
        t0, t1, s0, s1 = xs
        y1, z = rec.radau_step(f, t0, y, t1 - t0, unrolled=loops.newton_unrolled,
                               inline_solves=loops.inline_solves, stage_args=((s0,), (s1,)),
                               return_stages=True)
        return y1, (y1, z)

    _, (ys, zs) = jax.lax.scan(step, y0, (t_lo, t_hi, stage_args[0], stage_args[1]),
                               unroll=loops.scan_unroll)
    return ys, zs


def _step_map(rhs, t0, t1, y, z, stage_args, params, d_stage_args, d_params):
    """The stage increments' tangent map of one step at its converged ``z``: dZ = P dy_n + q
    with P = M⁻¹ h (A ⊗ J) E (2n × n) and q = M⁻¹ h (A ⊗ I) g (2n); the module docstring's Φ
    and β are I + P's and q's second block (y_{n+1} = y_n + Z_2).

    M is small (6 × 6 for the three recombination states): straight-line LU (``small_linalg``)
    rather than LAPACK, whose batched calls under this vmap share XLA:CPU's thread pool and can
    deadlock (``thermodynamics.LoopShape``).
    """
    n = y.shape[0]
    h = t1 - t0
    A = jnp.asarray(rec.RADAU_A)
    c = jnp.asarray(rec.RADAU_C)
    times = [t0 + c[i] * h for i in range(2)]
    points = [y + z[i] for i in range(2)]
    J = [jax.jacfwd(lambda u, i=i: rhs(times[i], u, stage_args[i], params))(points[i])
         for i in range(2)]
    g = [jax.jvp(lambda s, q, i=i: rhs(times[i], points[i], s, q),
                 (stage_args[i], params), (d_stage_args[i], d_params))[1] for i in range(2)]
    eye = jnp.eye(n)
    M = jnp.block([[eye - h * A[0, 0] * J[0], -h * A[0, 1] * J[1]],
                   [-h * A[1, 0] * J[0], eye - h * A[1, 1] * J[1]]])
    R = h * jnp.concatenate([A[0, 0] * J[0] + A[0, 1] * J[1], A[1, 0] * J[0] + A[1, 1] * J[1]])
    G = h * jnp.concatenate([A[0, 0] * g[0] + A[0, 1] * g[1], A[1, 0] * g[0] + A[1, 1] * g[1]])
    lu = lu_factor_small(M)
    columns = jax.vmap(lambda col: lu_solve_small(lu, col), in_axes=1, out_axes=1)
    return columns(R), lu_solve_small(lu, G)


def _collocation_derivative(t_lo, t_hi, zs):
    """dy/dt at every step's end from its stage increments: the collocation polynomial's
    derivative at c = 1, ((A⁻¹ ⊗ I) Z)_2 / h, which equals rhs(t_hi, y_{n+1}) once the stages
    solve the collocation equations exactly. Why not the rhs itself: where the system is stiff
    (rates ~1e8 per unit t) the rhs multiplies the Newton iteration's residual by the rates, while
    this divides it by h."""
    a_inv = np.linalg.inv(np.asarray(rec.RADAU_A))[1]
    h = (t_hi - t_lo)[:, None]
    return (a_inv[0] * zs[..., 0, :] + a_inv[1] * zs[..., 1, :]) / h


def radau_path(rhs: Callable, t_lo, t_hi, y0, stage_args, params, loops):
    """(states, d/dt) at ``t_hi`` (each (N, n)) of y' = rhs(t, y, s, params) from
    y(t_lo[0]) = y0, one Radau IIA step per cell [t_lo[n], t_hi[n]]; ``stage_args`` = (s at
    t_lo + c_0 h, s at t_hi), each (N,) — what the rhs reads that depends on time alone,
    computed by the caller for every step. The derivatives are the collocation polynomial's
    (``_collocation_derivative``).

    Differentiable in ``y0``, ``stage_args`` and ``params`` (a pytree of float scalars) by the
    linearised recurrence of the module docstring; ``t_lo``/``t_hi`` are the fixed grid (no
    tangent). ``loops`` (``thermodynamics.LoopShape``) shapes the primal's loop.
    """
    # the grid is an argument, not a closed-over value: under jit it is a tracer of the caller's
    # trace, and a rule closing over it fails when a later transformation (jacfwd of a jitted
    # caller) runs the rule after that trace has ended
    @jax.custom_jvp
    def path(t_lo, t_hi, y0, stage_args, params):
        ys, zs = _integrate(rhs, t_lo, t_hi, y0, stage_args, params, loops)
        return ys, _collocation_derivative(t_lo, t_hi, zs)

    @path.defjvp
    def path_jvp(primals, tangents):
        t_lo, t_hi, y0, stage_args, params = primals
        _, _, dy0, d_stage_args, d_params = tangents      # the grid's tangents: none (fixed)
        ys, zs = _integrate(rhs, t_lo, t_hi, y0, stage_args, params, loops)
        y_prev = jnp.concatenate([y0[None], ys[:-1]])
        step_maps = jax.vmap(
            lambda t0, t1, y, z, s0, s1, ds0, ds1: _step_map(
                rhs, t0, t1, y, z, (s0, s1), params, (ds0, ds1), d_params))
        dz_dy, dz_free = step_maps(t_lo, t_hi, y_prev, zs, stage_args[0], stage_args[1],
                                   d_stage_args[0], d_stage_args[1])
        n = y0.shape[0]
        phi = jnp.eye(n) + dz_dy[:, n:]
        dys = affine_recurrence(phi, dz_free[:, n:], dy0)
        dy_prev = jnp.concatenate([dy0[None], dys[:-1]])
        dzs = jnp.einsum("sij,sj->si", dz_dy, dy_prev) + dz_free
        dzs = dzs.reshape(dzs.shape[0], 2, n)
        return ((ys, _collocation_derivative(t_lo, t_hi, zs)),
                (dys, _collocation_derivative(t_lo, t_hi, dzs)))

    return path(t_lo, t_hi, y0, tuple(stage_args), params)
