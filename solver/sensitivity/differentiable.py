"""Exact derivatives through the ensemble solve by forward sensitivities.

``solve_diff(rhs, y0, t_save, params, args=...)`` returns the saved states ``ys`` (N, m_save, n)
like ``solve(...).ys`` and is differentiable with ``jax.jvp``, ``jax.jacfwd``, ``jax.grad``,
``jax.jacrev`` and ``jax.vjp`` with respect to ``y0``, ``params`` and the float leaves of
``args`` (tables shared by all trajectories); it composes with ``jax.jit`` and ``jax.vmap``.
Save times, ``t0`` and ``t_end`` are not differentiated (their tangents are treated as zero).

* An undifferentiated call is the ordinary solve: the backend's ``solve_ys``, the same cached
  plan and loop that ``solver.solve`` runs; nothing about sensitivities is built or run.
* Under differentiation a ``jax.custom_jvp`` rule returns the ordinary solve as primal and, as
  tangent, one linear primitive (``primitive.sensitivity_tangent_p``) of the input tangents,
  implemented by the backend's ``solve_sensitivities``: on the JAX backend the joint system
  [y, s_1 .. s_m] (``backends.jax.joint``), on the CUDA backend the generated sensitivity kernel
  (for the EB models a block per trajectory and group of up to four directions, a warp each;
  otherwise a GPU thread per (trajectory, direction)).
* Error control: ``sensitivity_error_control=True`` (default) includes the sensitivities in the
  error norm (the weights are scaled so the joint error² = Σ over blocks of each block's RMS²,
  hence every block is controlled at least as tightly as the plain solve controls y); ``False``
  gives them zero weight, so the joint solve takes exactly the plain solve's steps and the
  sensitivities carry whatever error those steps make. The JAX joint solve of m directions
  controls RMS_y² + Σ_d RMS_s_d²; the CUDA thread kernel each direction's RMS_y² + RMS_s², the
  warp kernel the same sum over each block's directions; so the backends take different steps
  and agree to the tolerance, not to rounding.
* Reverse mode costs one sensitivity solve with K = (differentiated input components per
  trajectory) directions: fine for a handful of parameters, expensive when a large table in
  ``args`` is differentiated. For a pipeline θ → tables → solve, wrap the whole θ-map with
  :func:`grad_by_forward_mode` so ``jax.grad`` costs one solve with len(θ) directions.

On the CUDA backend ``args`` must be one array read through ``rhs.table_split`` (as for ``solve``);
the tangent tables enter linearly (Hermite lookup is linear in the table). Details and
measurements: docs/gradients.md.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from ..caches import Cache
from .primitive import sensitivity_tangent_p
from .spec import prepare

__all__ = ["solve_diff", "joint_solve", "solve_with_tangents", "grad_by_forward_mode"]

#: the custom_jvp function of each spec (its identity keys JAX's jit caches)
DIFF_FNS = Cache("sensitivity.diff_fns", maxsize=256)


def _is_zero(t):
    return isinstance(t, jax.custom_derivatives.SymbolicZero) or t is None


def _diff_fn(cfg):
    return DIFF_FNS.get_or_build(cfg, lambda: _make_diff_fn(cfg))


def _make_diff_fn(cfg):
    @jax.custom_jvp
    def f(y0, params, args, ts, t0, te):
        return cfg.backend.solve_ys(cfg, y0, params, args, ts, t0, te)

    @functools.partial(f.defjvp, symbolic_zeros=True)
    def f_jvp(primals, tangents):
        y0, params, args, ts, t0, te = primals
        dy0, dp, dargs = tangents[:3]
        ys = f(y0, params, args, ts, t0, te)
        leaves = jax.tree_util.tree_leaves(args)
        dleaves = jax.tree_util.tree_leaves(
            dargs, is_leaf=lambda x: isinstance(x, jax.custom_derivatives.SymbolicZero))
        arg_idx, arg_tans = [], []
        for i, (fl, d) in enumerate(zip(cfg.float_leaf, dleaves)):
            if fl and not _is_zero(d):
                arg_idx.append(i)
                arg_tans.append(jnp.asarray(d, jnp.float64)[None])
        mask = (not _is_zero(dy0), not _is_zero(dp) and cfg.P > 0, tuple(arg_idx))
        tans = []
        if mask[0]:
            tans.append(jnp.asarray(dy0, jnp.float64)[None])
        if mask[1]:
            tans.append(jnp.asarray(dp, jnp.float64)[None])
        tans += arg_tans
        if not tans:
            return ys, jnp.zeros_like(ys)
        out = sensitivity_tangent_p.bind(y0, params, *leaves, ts, t0, te, *tans,
                                         cfg=cfg, mask=mask)
        return ys, out[0]

    return f


def solve_diff(rhs: Callable, y0, t_save, params, *, args=None, rtol: float = 1e-6,
               atol=1e-9, t0=None, t_end=None, error_weights=None,
               sensitivity_error_control: bool | float = True, sensitivity_atol=None,
               max_steps: int = 100_000, **solve_kwargs):
    """Differentiable ensemble solve: returns ``ys`` (N, m_save, n), as ``solve(...).ys``.

    Same arguments as :func:`solver.solve` (``sparsity``, ``linear_solver``, ``controller``,
    ``tableau``, ``first_step`` pass through; ``backend`` "jax" (default), "cuda", "auto" or a
    Backend object: see the module docstring for the CUDA backend).  Differentiable w.r.t. ``y0``
    (N, n), ``params`` (N, P) and the float leaves of ``args`` with jvp/jacfwd/grad/jacrev/vjp;
    t_save, t0, t_end are not differentiated.  ``rtol``, ``atol``, ``error_weights`` must be
    concrete (they are compile-time settings).

    sensitivity_error_control: include the sensitivities in the step-size control (True,
        default; the steps then also resolve the sensitivities, so the derivative is accurate to
        about the tolerance) or not (False; the joint solve takes the plain solve's steps, cheaper,
        but the derivative's error is not controlled — see docs/gradients.md); a number w in
        (0, 1) is their weight in the error norm: they are controlled at rtol / w (and atol / w).
    sensitivity_atol: absolute tolerance of the sensitivity components (default: atol).
    Failed trajectories give NaN (as ``solve``'s ys); check ``solve(...).failures()`` if in doubt.
    """
    cfg, y0, params, ts, t0a, tea = prepare(rhs, y0, t_save, params, args, rtol, atol, t0, t_end,
                                             error_weights, sensitivity_atol,
                                             sensitivity_error_control, max_steps, solve_kwargs)
    return _diff_fn(cfg)(y0, params, args, ts, t0a, tea)


def joint_solve(rhs: Callable, y0, t_save, params, *, dy0=None, dparams=None, dargs=None,
                args=None, rtol: float = 1e-6, atol=1e-9, t0=None, t_end=None,
                error_weights=None, sensitivity_error_control: bool | float = True,
                sensitivity_atol=None, max_steps: int = 100_000, **solve_kwargs):
    """Eager joint solve for explicit directions (diagnostics, docs, tests).

    dy0: (m, N, n), dparams: (m, N, P), dargs: pytree like args with a leading m on each leaf
    (any may be None). Returns ``(ys, dys, info)``: ys (N, ns, n), dys (m, N, ns, n) and info with
    the joint solve's status and accepted/rejected step counts per trajectory; on the CUDA
    backend also per thread (``thread_status``, ``thread_n_accepted``, ``thread_n_rejected``,
    (m, N)) and the launch's own statistics (``launch``: kernel seconds, threads, local memory).
    Option ``_jacobian="block_diagonal"`` (in solve_kwargs, JAX backend) drops the d²f/dy²·s
    block from the joint Jacobian: a diagnostic that shows why the exact block is needed.
    """
    cfg, mask, ops, tans = _explicit_directions(
        "joint_solve", rhs, y0, t_save, params, args, dy0, dparams, dargs, rtol, atol, t0, t_end,
        error_weights, sensitivity_atol, sensitivity_error_control, max_steps, solve_kwargs)
    return cfg.backend.joint_solve(cfg, mask, *ops, *tans)


def _explicit_directions(caller, rhs, y0, t_save, params, args, dy0, dparams, dargs, rtol, atol,
                         t0, t_end, error_weights, sensitivity_atol, sec, max_steps, solve_kwargs):
    """(spec, mask, (y0, params, args leaves, ts, t0, t_end), (dy0, dp, arg-leaf tangents)) for
    a solve along explicit tangents: dy0 (m, N, n), dparams (m, N, P), dargs (args' tree with a
    leading m on each leaf), any of them None."""
    cfg, y0, params, ts, t0a, tea = prepare(rhs, y0, t_save, params, args, rtol, atol, t0, t_end,
                                             error_weights, sensitivity_atol, sec, max_steps,
                                             solve_kwargs)
    arg_idx, dl = [], []
    if dargs is not None:
        for i, d in enumerate(jax.tree_util.tree_leaves(dargs)):
            if d is not None and cfg.float_leaf[i]:
                arg_idx.append(i)
                dl.append(jnp.asarray(d, jnp.float64))
    mask = (dy0 is not None, dparams is not None and cfg.P > 0, tuple(arg_idx))
    dy0 = None if dy0 is None else jnp.asarray(dy0, jnp.float64)
    dp = None if not mask[1] else jnp.asarray(dparams, jnp.float64)
    if dy0 is None and dp is None and not dl:
        raise ValueError(f"{caller} needs at least one tangent (dy0, dparams or dargs)")
    leaves = tuple(jax.tree_util.tree_leaves(args))
    return cfg, mask, (y0, params, leaves, ts, t0a, tea), (dy0, dp, tuple(dl))


def solve_with_tangents(rhs: Callable, y0, t_save, params, *, dy0=None, dparams=None,
                        dargs=None, args=None, rtol: float = 1e-6, atol=1e-9, t0=None,
                        t_end=None, error_weights=None, sensitivity_error_control: bool | float = True,
                        sensitivity_atol=None, max_steps: int = 100_000, saved_states=None,
                        **solve_kwargs):
    """Traceable values and directional derivatives of the solve: ``(ys, dys)``, ys (N, ns, n)
    and dys (m, N, ns, n) along the tangents dy0 (m, N, n), dparams (m, N, P), dargs (args' tree
    with a leading m on each leaf); any may be None.

    ``saved_states`` (state indices; None: all): ys and dys of those states only, (N, ns, k)
    and (m, N, ns, k), in increasing index order. Every state is still integrated; a caller
    that reads a few states at many save times (the CMB sources) so avoids moving the rest: on
    the CUDA backend the results cross from the GPU to the host and back, and only the kept
    states are copied.

    ``jax.vmap`` of ``jax.jvp`` of :func:`solve_diff` gives the same derivatives, but its values
    come from a separate plain solve: two integration loops in the compiled program. Here, on
    the JAX backend, ys is the joint solve's own y (the steps that also control the
    sensitivities, so ys equals ``solve_diff``'s to the tolerance, not to rounding), and the
    program holds one loop. A backend with its own joint solve supplies both
    (``Backend.solve_with_sensitivities``: the CUDA backend's sensitivity kernel); for any other
    the plain solve runs beside the sensitivity solve.
    Not differentiable itself (it is the derivative)."""
    cfg, mask, ops, tans = _explicit_directions(
        "solve_with_tangents", rhs, y0, t_save, params, args, dy0, dparams, dargs, rtol, atol,
        t0, t_end, error_weights, sensitivity_atol, sensitivity_error_control, max_steps,
        solve_kwargs)
    states = _state_indices(saved_states, cfg.n)
    both = cfg.backend.solve_with_sensitivities(cfg, mask, *ops, *tans, states=states)
    if both is not None:
        return both
    y0, params, leaves, ts, t0a, tea = ops
    ys = cfg.backend.solve_ys(cfg, y0, params, args, ts, t0a, tea)
    present = [t for t in tans[:2] if t is not None] + list(tans[2])
    dys = sensitivity_tangent_p.bind(y0, params, *leaves, ts, t0a, tea, *present, cfg=cfg,
                                     mask=mask)
    if states is None:
        return ys, dys
    keep = jnp.asarray(states)
    return ys[..., keep], dys[..., keep]


def _state_indices(states, n: int):
    """``saved_states`` as a tuple of increasing distinct indices in [0, n) (None: all)."""
    if states is None:
        return None
    idx = [int(i) for i in states]
    if not idx or any(b <= a for a, b in zip(idx, idx[1:])) or idx[0] < 0 or idx[-1] >= n:
        raise ValueError(f"saved_states must be increasing distinct state indices in "
                         f"[0, {n}), at least one; got {list(states)}")
    return tuple(idx)


def grad_by_forward_mode(fun: Callable) -> Callable:
    """Wrap ``fun(*xs)`` so reverse mode (grad/vjp/jacrev) uses ``jax.jacfwd`` inside.

    For a pipeline θ → (tables, ICs) → solve_diff → outputs with few θ: ``jax.grad`` of the
    wrapped function costs one joint solve with len(θ) directions (plus the θ → tables
    derivatives), instead of the unit-direction sensitivities of every table entry that the
    solve's own transpose rule would need.  Forward mode (jvp/jacfwd) of the wrapped function is
    not available (it is a ``custom_vjp``); call ``fun`` itself for that.
    """

    @jax.custom_vjp
    def wrapped(*xs):
        return fun(*xs)

    def fwd(*xs):
        out = fun(*xs)
        jac = jax.jacfwd(fun, argnums=tuple(range(len(xs))))(*xs)
        return out, jac

    def bwd(jac, ct):
        ct_leaves, ct_tree = jax.tree_util.tree_flatten(ct)
        jac_per_out = ct_tree.flatten_up_to(jac)       # each: tuple over inputs
        grads = None
        for c, jo in zip(ct_leaves, jac_per_out):
            g = tuple(jax.tree_util.tree_map(
                lambda J, c=c: jnp.tensordot(c, J, axes=c.ndim), ji) for ji in jo)
            grads = g if grads is None else jax.tree_util.tree_map(jnp.add, grads, g)
        return grads

    wrapped.defvjp(fwd, bwd)
    return wrapped
