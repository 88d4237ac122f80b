"""Input validation shared by every entry point and backend.

Bad input must never reach a kernel: a NaN initial state or an unordered save grid would come back
as a failed or silently wrong trajectory far from its cause. So every array argument is checked
here, once, with an error that names the argument and what is allowed.

``validate_inputs`` checks host (numpy-convertible) values completely. ``validate_traceable``
serves the entry points that may run under a JAX transformation (``solve_diff``, the CUDA
backend's ``solve_jax``): it normalises shapes always and checks values only when they are
concrete, since a tracer has no values to inspect. The static options (tolerances, weights,
``max_steps``) are checked by ``check_options`` in both cases.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["ValidatedInputs", "TraceableInputs", "validate_inputs", "validate_traceable",
           "check_options", "norm_rows", "require_x64", "is_tracer"]


class ValidatedInputs(NamedTuple):
    """Host-side inputs after validation, shaped for every backend."""

    y0: np.ndarray          # (N, n)
    params: np.ndarray      # (N, P)
    t_save: np.ndarray      # (N, m)
    t0: np.ndarray          # (N,)
    t_end: np.ndarray       # (N,)
    atol: np.ndarray        # (n,)
    weights: np.ndarray     # (n,), or (N, n) per trajectory
    first_step: np.ndarray  # (N,), NaN = automatic


class TraceableInputs(NamedTuple):
    """``validate_traceable``'s result: JAX float64 arrays (tracers under a transformation)."""

    y0: object      # (N, n)
    params: object  # (N, P)
    t_save: object  # (N, m)
    t0: object      # (N,)
    t_end: object   # (N,)


def require_x64(what: str = "the solver") -> None:
    """The solver computes in float64; with JAX's default 32-bit mode every array would be
    silently truncated, so refuse to run instead."""
    import jax

    if not jax.config.jax_enable_x64:
        raise RuntimeError(
            f"{what} needs JAX's 64-bit mode, which is off: call "
            "jax.config.update(\"jax_enable_x64\", True) before the first JAX computation "
            "(or set the environment variable JAX_ENABLE_X64=1).")


def is_tracer(x) -> bool:
    import jax

    return isinstance(x, jax.core.Tracer)


def check_options(n: int, rtol, atol, error_weights, max_steps, *,
                  n_traj: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Check the static options of a solve of n variables; returns atol (n,) and the weights,
    (n,) or (N, n).

    ``n_traj``: the number of trajectories where the caller takes per-trajectory weights too --
    ``error_weights`` may then be (N, n), one row per trajectory (``solve`` and the sensitivity
    solves, which give a trajectory's directions its row)."""
    if not (0 < rtol < 1):
        raise ValueError(f"rtol must be in (0, 1), got {rtol}")
    atol_a = np.broadcast_to(np.asarray(atol, np.float64), (n,)).copy() \
        if np.ndim(atol) in (0, 1) and np.size(atol) in (1, n) else None
    if atol_a is None or np.any(atol_a <= 0):
        raise ValueError(f"atol must be a positive scalar or an array of shape ({n},)")
    if error_weights is None:
        w = np.ones(n)
    else:
        w = np.asarray(error_weights, np.float64)
        shapes = [(n,)] + ([(n_traj, n)] if n_traj is not None else [])
        if w.shape not in shapes or np.any(w < 0) or not np.all(np.isfinite(w)):
            allowed = " or ".join(str(x) for x in shapes)
            raise ValueError(f"error_weights must be a finite non-negative array of shape "
                             f"{allowed}, got shape {w.shape}")
        if not np.all(np.any(w > 0, axis=-1)):
            raise ValueError("error_weights: at least one component must have a positive weight"
                             + (" in every row" if w.ndim == 2 else ""))
    if not (isinstance(max_steps, (int, np.integer)) and max_steps > 0):
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    return atol_a, w


def norm_rows(weights: np.ndarray) -> tuple[np.ndarray, float]:
    """The error weights as the CUDA kernels take them: (rows, n_weighted).

    The error norm is sqrt(Σ (w e / sc)² / n_weighted), n_weighted the number of positive
    weights. Shared weights (n,) give one row and their count; per-trajectory weights (N, n)
    may count differently per row, so each row is divided by the square root of its own count
    and n_weighted is 1 -- the same norm, one scalar for the launch. (The JAX ensemble loop
    keeps the rows as they are, with a count per row.)"""
    w = np.asarray(weights, np.float64)
    if w.ndim == 1:
        return w[None, :], float(max(int(np.sum(w > 0)), 1))
    counts = np.maximum(np.sum(w > 0, axis=1), 1).astype(np.float64)
    return w / np.sqrt(counts)[:, None], 1.0


def _normalise(xp, y0, t_save, params, t0, t_end):
    """Shapes of the array arguments, with ``xp`` numpy or jax.numpy: (y0, params, ts, t0, te)."""
    y0 = xp.asarray(y0, dtype=xp.float64)
    if y0.ndim != 2:
        raise ValueError(f"y0 must have shape (N, n) (N trajectories of n variables); got shape "
                         f"{y0.shape}. For one trajectory use y0[None, :].")
    N, n = y0.shape
    if N == 0 or n == 0:
        raise ValueError(f"y0 must be non-empty, got shape {y0.shape}")
    params = xp.asarray(params, dtype=xp.float64)
    if params.ndim == 1 and params.size == 0:
        params = xp.zeros((N, 0))
    if params.ndim != 2 or params.shape[0] != N:
        raise ValueError(f"params must have shape (N, P) with N = {N} (one row per trajectory); "
                         f"got shape {params.shape}")
    ts = xp.asarray(t_save, dtype=xp.float64)
    if ts.ndim == 1:
        ts = xp.broadcast_to(ts, (N, ts.size))
    if ts.ndim != 2 or ts.shape[0] != N or ts.shape[1] == 0:
        raise ValueError(f"t_save must have shape (m,) or (N, m) with N = {N}, m >= 1; got "
                         f"{np.shape(t_save)}")
    t0a = ts[:, 0] if t0 is None else xp.broadcast_to(xp.asarray(t0, dtype=xp.float64), (N,))
    tea = ts[:, -1] if t_end is None else xp.broadcast_to(xp.asarray(t_end, dtype=xp.float64),
                                                          (N,))
    return y0, params, ts, t0a, tea


def _check_finite(name, a):
    if not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))[:3].tolist()
        raise ValueError(f"{name} contains non-finite values (first at indices {bad}); "
                         "every entry must be a finite float")


def _check_values(y0, params, ts, t0a, tea) -> None:
    """Value checks on host arrays of normalised shapes."""
    for name, a in (("y0", y0), ("params", params), ("t_save", ts), ("t0", t0a),
                    ("t_end", tea)):
        _check_finite(name, a)
    if np.any(np.diff(ts, axis=1) < 0):
        raise ValueError("t_save must be ascending along each trajectory")
    if np.any(tea < t0a):
        raise ValueError("t_end must be >= t0 for every trajectory (forward integration only)")
    if np.any(ts < t0a[:, None]) or np.any(ts > tea[:, None]):
        raise ValueError("every save time must lie within [t0, t_end] of its trajectory")


def validate_inputs(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                    first_step) -> ValidatedInputs:
    """Check and normalise ``solve``'s arguments on the host (shared by every backend).

    Raises ValueError naming the argument and what is allowed.
    """
    y0, params, ts, t0a, tea = _normalise(np, y0, t_save, params, t0, t_end)
    _check_values(y0, params, ts, t0a, tea)
    N = y0.shape[0]
    atol_a, w = check_options(y0.shape[1], rtol, atol, error_weights, max_steps, n_traj=N)
    h0 = np.full(N, np.nan) if first_step is None else \
        np.broadcast_to(np.asarray(first_step, np.float64), (N,))
    return ValidatedInputs(y0, params, ts, t0a, tea, atol_a, w, h0)


def validate_traceable(y0, t_save, params, t0, t_end) -> TraceableInputs:
    """The array arguments as JAX float64 arrays of normalised shapes; their values are checked
    as ``validate_inputs`` does when none is a tracer (under ``jit`` they cannot be)."""
    import jax.numpy as jnp

    arrays = _normalise(jnp, y0, t_save, params, t0, t_end)
    if not any(is_tracer(a) for a in arrays):
        _check_values(*(np.asarray(a) for a in arrays))
    return TraceableInputs(*arrays)
