"""The JAX backend's forward sensitivities: the joint system [y, s_1 .. s_m] on the same solver.

Per trajectory the state and m directional sensitivities s_d = S θ̇_d are integrated together::

    y'   = f(y, t, p, args)
    s_d' = J s_d + (∂f/∂p) ṗ_d + (∂f/∂args) ȧrgs_d = jvp(f, (y, p, args), (s_d, ṗ_d, ȧrgs_d))
    s_d(t0) = ẏ0_d

by the same Rodas5P ensemble loop. The augmented rhs is a Python closure that slices ``z`` and
``p`` with literal ranges and returns a tuple. Its Jacobian is taken by forward AD of the jvp
(forward-over-forward), so it contains the block ∂s_d'/∂y = d²f/dy² · s_d exactly: dropping it
(the "block-diagonal" approximation, kept as the diagnostic ``jacobian="block_diagonal"``) turns
W into a poor approximation on bilinear problems, and the step count explodes
(tests/test_sensitivity.py). The joint W is block lower-triangular with W0 = I/(hγ) − J on every
diagonal block, so it is solved staggered (``build_block_triangular_solver``: W0 factored once)
and the Jacobian is swept over the y columns only.

An rhs that declares its Jacobian (``rhs.linear_jacobian``, solver.linalg.direct) is linear in y,
so ∂s_d'/∂y = H_d = (∂J/∂θ)·θ̇_d is the derivative of J's declared entries along the direction:
the joint plan then takes J from the entries, every H_d by one forward sweep of the entries
function in (p, args), and f and ∂f/∂t of the joint rhs from one evaluation at three times
(``central_dfdt``) -- no colour sweeps of the forward-over-forward joint rhs, whose compiled
program is what made a CPU Jacobian of the EB model take tens of minutes and gigabytes to
compile.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from ...caches import Cache
from ...linalg.direct import build_direct_jacobian, declared_pattern, direct_jacobian_of
from ...linalg.linear import build_block_triangular_solver
from ...linalg.sparsity import detect_sparsity
from .ensemble import hnw_initial_step
from .plan import JaxPlan, abstract_args, get_plan

__all__ = ["plain_plan", "joint_run", "h0", "central_dfdt"]

#: joint plans by (spec, m, mask, lanes)
JOINT_PLANS = Cache("jax.joint_plans", maxsize=32)
#: (base pattern, coupling block) by (spec, mask, jacobian)
AUG_PATTERNS = Cache("jax.joint_patterns", maxsize=64)


def plain_plan(spec, args, lanes=None):
    """The undifferentiated solve's plan (the same cache as ``solve``'s), built possibly inside a
    trace."""
    return get_plan(spec.rhs, spec.n, spec.P, spec.has_args, args, spec.sparsity,
                    spec.linear_solver, spec.tableau, spec.ctrl, spec.max_steps, in_trace=True,
                    lanes=lanes)


def h0(spec, N):
    """The first step of every trajectory (NaN: automatic)."""
    return jnp.full((N,), jnp.nan if spec.first_step is None else spec.first_step, jnp.float64)


def _make_aug(spec, m, mask, jacobian, as_array=False):
    """Augmented rhs for m directions; mask = (y0 present, params present, args-leaf indices).
    It returns a tuple of n(1 + m) components (the rhs contract the sparsity detection and the
    colour sweeps take) or, ``as_array``, one (n(1 + m),) array (the compiled loop's form)."""
    rhs, n, P = spec.rhs, spec.n, spec.P
    treedef = spec.treedef
    arg_idx = mask[2]
    block_diag = jacobian == "block_diagonal"

    def aug(z, t, q, A):
        args_leaves, dargs = A
        y = z[:n]
        S = z[n:].reshape(m, n)
        p = q[:P]
        dP = q[P:].reshape(m, P)
        dargs = tuple(dargs)

        def g(y_, p_, ad_):
            leaves = list(args_leaves)
            for i, v in zip(arg_idx, ad_):
                leaves[i] = v
            if spec.has_args:
                out = rhs(y_, t, p_, jax.tree_util.tree_unflatten(treedef, leaves))
            else:
                out = rhs(y_, t, p_)
            return jnp.stack(jnp.broadcast_arrays(*[jnp.asarray(o, z.dtype) for o in out]))

        ad0 = tuple(args_leaves[i] for i in arg_idx)
        fy = g(y, p, ad0)
        yl = jax.lax.stop_gradient(y) if block_diag else y
        ds = jax.vmap(lambda s, dp, da: jax.jvp(g, (yl, p, ad0), (s, dp, da))[1])(S, dP, dargs)
        out = jnp.concatenate([fy, ds.reshape(-1)])
        return out if as_array else tuple(out[i] for i in range(n * (1 + m)))

    return aug


def _declared(spec):
    """The rhs's declared Jacobian when the joint plan may use it (exact Jacobian only)."""
    return direct_jacobian_of(spec.rhs) if spec.jacobian == "exact" else None


#: ``central_dfdt``'s increment: this fraction of the step ...
DFDT_STEP_FRACTION = 2.0 ** -20
#: ... and at least this fraction of max(|t|, 1), so that t ± δ stay thousands of ulps apart
DFDT_TIME_FLOOR = 2.0 ** -40


def central_dfdt(f_of_t, t, h):
    """(f(t), ∂f/∂t) of the joint rhs by a central difference, from ONE vmapped evaluation of
    f at (t − δ, t, t + δ), δ = max(2⁻²⁰ h, 2⁻⁴⁰ max(|t|, 1)).

    Why not forward mode: ``jax.jvp`` in t of the joint rhs differentiates a jvp (the
    directions' tangents) again, a third of the step's Jacobian in the compiled program, for a
    step no faster: a third of what a later process loads and of the first process's compile
    (the P(k) ``--gradients`` first run's peak fell from 5554 to 4341 MB on the 2-core CPU,
    ``scripts/bench_first_run.py``, docs/benchmarks.md).

    Why it is good enough: ∂f/∂t enters a Rosenbrock stage only as h·d_i·∂f/∂t, so the error
    that matters is that of h·∂f/∂t. Rounding contributes ≲ hε|f|/δ ≤ 2²⁰ε|f| ≈ 2e-10 |f|
    whatever the step; truncation h·δ²|f‴|/6 = 2⁻⁴⁰h³|f‴|/6, negligible wherever the step
    resolves f. The separation is taken as computed ((t + δ) − (t − δ) is exact), so rounding
    in t ± δ costs nothing. On the EB model h·∂f/∂t agrees with forward mode to 2e-8 of max |f|
    for steps from 1e-7 to 0.3 in ln a (tests/test_linear_jacobian.py), far inside the
    solve's tolerance (rtol 1e-5).
    """
    delta = jnp.maximum(DFDT_STEP_FRACTION * jnp.abs(h),
                        DFDT_TIME_FLOOR * jnp.maximum(jnp.abs(t), 1.0))
    lo, hi = t - delta, t + delta
    f_lo, f_val, f_hi = jax.vmap(f_of_t)(jnp.stack([lo, t, hi]))
    return f_val, (f_hi - f_lo) / (hi - lo)


def _direct_joint_builder(spec, m, mask, lj, base_linear, coupling):
    """jac_builder for JaxPlan: the joint slots [W0's J | per direction: 0 on the diagonal, H_d
    on the coupling pattern] from the declared entries and their directional derivatives."""
    n, P = spec.n, spec.P
    treedef, arg_idx = spec.treedef, mask[2]
    placed = build_direct_jacobian(lj, base_linear.slot_rows, base_linear.slot_cols)
    cr, cc = np.nonzero(coupling)
    entry = {(int(r), int(c)): e for e, (r, c) in enumerate(zip(lj.rows, lj.cols))}
    coupling_entries = np.array([entry[(int(r), int(c))] for r, c in zip(cr, cc)], np.int64)

    def build(f, linear):
        def jac(z, t, q, A, h):
            f_val, dfdt = central_dfdt(lambda t_: f(z, t_, q, A), t, h)
            args_leaves, dargs = A
            p, dP = q[:P], q[P:].reshape(m, P)

            def entries(p_, ad_):
                leaves = list(args_leaves)
                for i, v in zip(arg_idx, ad_):
                    leaves[i] = v
                args = jax.tree_util.tree_unflatten(treedef, leaves) if spec.has_args else None
                vals = lj.values(t, p_, args) if spec.has_args else lj.values(t, p_)
                return jnp.stack(jnp.broadcast_arrays(*[jnp.asarray(v, z.dtype) for v in vals]))

            ad0 = tuple(args_leaves[i] for i in arg_idx)
            j_vals = entries(p, ad0)
            h_vals = jax.vmap(lambda dp, da: jax.jvp(entries, (p, ad0), (dp, da))[1])(
                dP, tuple(dargs))
            blocks = jnp.concatenate([jnp.zeros((m, n), z.dtype), h_vals[:, coupling_entries]],
                                     axis=1)
            return f_val, jnp.concatenate([placed.to_slots(j_vals), blocks.reshape(-1)]), dfdt
        return jac
    return build


def _aug_pattern(spec, mask, base_pattern, args_example, jacobian, stats):
    """Pattern of the m-direction joint Jacobian from the one-direction coupling block.

    Structure [[P, 0, ..], [P', P, 0, ..], [P', 0, P, ..], ..] where P' = ∂s'/∂y (Hessian
    coupling) is detected on the one-direction augmented rhs (P' ⊆ P always holds).
    """
    def build():
        n = spec.n
        t0 = time.perf_counter()
        lj = _declared(spec)
        if jacobian == "block_diagonal":
            coupling = np.zeros((n, n), bool)
        elif lj is not None:
            # H_d = (∂J/∂θ)·θ̇_d has at most J's declared entries
            coupling = declared_pattern(lj, n) & base_pattern
        else:
            aug1 = _make_aug(spec, 1, mask, jacobian)
            A1 = _aug_args(spec, args_example, mask, 1)
            with jax.ensure_compile_time_eval():
                pat1 = detect_sparsity(aug1, 2 * n, 2 * spec.P, args=A1)
            coupling = pat1[n:, :n] & base_pattern
        stats["pattern_seconds"] += time.perf_counter() - t0
        return base_pattern, coupling

    return AUG_PATTERNS.get_or_build((spec, mask, jacobian), build)


def _block_pattern(base, coupling, m):
    n = base.shape[0]
    pat = np.zeros((n * (1 + m), n * (1 + m)), bool)
    pat[:n, :n] = base
    for d in range(m):
        r = slice(n * (1 + d), n * (2 + d))
        pat[r, :n] = coupling
        pat[r, r] = base
    return pat


def _aug_args(spec, args, mask, m):
    leaves = tuple(jax.tree_util.tree_leaves(abstract_args(args))) if spec.has_args else ()
    dargs = tuple(jax.ShapeDtypeStruct((m,) + spec.leaf_meta[i][0], jnp.float64)
                  for i in mask[2])
    return (leaves, dargs)


def _block_scale(spec, m):
    """The factor on every block's error weights in the joint norm: √(1+m) with the
    sensitivities in it (docs/gradients.md, SEC), 1 without (y's norm is the plain solve's)."""
    return np.sqrt(1.0 + m) if spec.sec > 0.0 else 1.0


def _primal_initial_step(spec, plain, m):
    """The joint system's automatic first step: the plain system's (``hnw_initial_step`` of
    the plain rhs on the y block, with its own error weights), so that the program holds the
    plain rhs there instead of another copy of the joint one (for the EB model's ten-direction
    Jacobian, 13 % of the joint solve's operations and 10 % of its XLA:CPU compile time). With
    the sensitivities out of the norm the joint solve then takes the plain solve's steps
    exactly."""
    step = hnw_initial_step(plain.f, spec.tableau)
    n, P = spec.n, spec.P
    scale = _block_scale(spec, m)

    def initial(z0, t0, t_end, q, A, rtol, atol, weights, n_weighted):
        args = jax.tree_util.tree_unflatten(spec.treedef, list(A[0])) if spec.has_args else None
        w = weights[:n] / scale
        return step(z0[:n], t0, t_end, q[:P], args, rtol, atol[:n], w,
                    jnp.maximum(jnp.sum(w > 0), 1))
    return initial


def _joint_plan(spec, m, mask, args, stats, lanes):
    def build():
        plain = plain_plan(spec, args)
        base, coupling = _aug_pattern(spec, mask, plain.pattern, args, spec.jacobian, stats)
        pattern = _block_pattern(base, coupling, m)
        aug = _make_aug(spec, m, mask, spec.jacobian)
        # W is block lower-triangular: factor the y block with the plain solve's W0 solver and
        # substitute (staggered, as the CUDA kernel does); J and the couplings H_d come from
        # sweeps over y alone
        linear = build_block_triangular_solver(plain.linear, coupling, m)
        lj = _declared(spec)
        builder = None if lj is None else _direct_joint_builder(spec, m, mask, lj, plain.linear,
                                                                coupling)
        with jax.ensure_compile_time_eval():
            plan = JaxPlan(aug, spec.n * (1 + m), spec.P * (1 + m), True,
                           _aug_args(spec, args, mask, m), pattern, spec.linear_solver,
                           spec.tableau, spec.ctrl, spec.max_steps, linear=linear,
                           seed_columns=np.arange(spec.n), jac_builder=builder,
                           f_array=_make_aug(spec, m, mask, spec.jacobian, as_array=True),
                           lanes=lanes, initial_step=_primal_initial_step(spec, plain, m))
        stats["joint_plans"] += 1
        return plan

    return JOINT_PLANS.get_or_build((spec, m, mask, lanes), build)


def joint_run(spec, mask, y0, params, args_leaves, ts, t0, te, dy0, dp, dargs, stats,
              lanes=None):
    """Run the joint solve; dy0 (m,N,n) | None, dp (m,N,P) | None, dargs tuple of (m, *leaf).
    Returns (EnsembleResult of z = [y, s_1..s_m], m)."""
    stats["joint_traces"] += 1
    present = [x for x in (dy0, dp) if x is not None] + list(dargs)
    m = present[0].shape[0]
    N, n = y0.shape
    P = spec.P
    args = jax.tree_util.tree_unflatten(spec.treedef, list(args_leaves)) if spec.has_args \
        else None
    plan = _joint_plan(spec, m, mask, args, stats, lanes)
    s0 = jnp.zeros((N, m * n)) if dy0 is None else jnp.moveaxis(dy0, 0, 1).reshape(N, m * n)
    dq = jnp.zeros((N, m * P)) if dp is None else jnp.moveaxis(dp, 0, 1).reshape(N, m * P)
    z0 = jnp.concatenate([y0, s0], axis=1)
    q = jnp.concatenate([params, dq], axis=1)
    A = (tuple(args_leaves), tuple(jnp.asarray(d, jnp.float64) for d in dargs))
    # the sensitivity blocks at the weight sec
    # (n,) shared or (N, n) a row per trajectory, its directions' blocks beside it
    w = np.concatenate([spec.weights] + [spec.weights * spec.sec] * m, axis=-1) * \
        _block_scale(spec, m)
    atol = np.concatenate([spec.atol] + [spec.sens_atol] * m)
    res = plan.run(z0, t0, te, ts, q, A, jnp.float64(spec.rtol), jnp.asarray(atol),
                   jnp.asarray(w), h0(spec, N))
    return res, m
