"""LU with partial pivoting for the tiny dense systems of the recombination ODE's implicit steps.

Why not ``jnp.linalg.solve`` / ``jax.scipy.linalg.lu_factor``: they lower to a LAPACK (CPU) or
cuSOLVER (GPU) call per system. Inside the thermodynamics' sequential scan (≈ 1440 Radau steps,
each one 3×3 solve, one 6×6 factorisation and six 6×6 solves) every such call is a separate
kernel with microseconds of fixed cost, most of the scan's time. Written as straight-line array
arithmetic on a static size, the factorisation and the substitutions fuse with the surrounding
right-hand-side evaluations. Partial pivoting keeps it as stable as LAPACK's getrf: the Radau
iteration matrix I − h (A ⊗ J) has entries of 1e5 and more where the Compton rate is stiff.

Differentiable (jvp, vjp) like any jnp code: the pivot choice is piecewise constant.
"""
from __future__ import annotations

import jax.numpy as jnp

__all__ = ["lu_factor_small", "lu_solve_small", "solve_small"]


def lu_factor_small(a):
    """(lu, perm) of a square matrix of static size n: ``a[perm] = L U``, L unit lower triangular
    (stored below the diagonal of ``lu``) and U upper triangular (on and above it)."""
    a = jnp.asarray(a)
    n = a.shape[0]
    perm = jnp.arange(n)
    for k in range(n - 1):
        p = k + jnp.argmax(jnp.abs(a[k:, k]))
        rows = jnp.stack([jnp.asarray(k), p])
        swapped = jnp.stack([p, jnp.asarray(k)])
        a = a.at[rows].set(a[swapped])
        perm = perm.at[rows].set(perm[swapped])
        col = a[k + 1:, k] / a[k, k]
        a = a.at[k + 1:, k].set(col)
        a = a.at[k + 1:, k + 1:].add(-col[:, None] * a[k, k + 1:][None, :])
    return a, perm


def lu_solve_small(lu_perm, b):
    """x with a x = b from ``lu_factor_small(a)``; b of shape (n,)."""
    lu, perm = lu_perm
    n = lu.shape[0]
    y = jnp.asarray(b)[perm]
    xs = []
    for i in range(n):                      # L y = P b (unit diagonal)
        yi = y[i] - sum((lu[i, j] * xs[j] for j in range(i)), jnp.zeros((), y.dtype))
        xs.append(yi)
    out = [None] * n
    for i in reversed(range(n)):            # U x = y
        s = sum((lu[i, j] * out[j] for j in range(i + 1, n)), jnp.zeros((), y.dtype))
        out[i] = (xs[i] - s) / lu[i, i]
    return jnp.stack(out)


def solve_small(a, b):
    """x with a x = b for a small square ``a`` of static size (one factorisation, one solve)."""
    return lu_solve_small(lu_factor_small(a), b)
