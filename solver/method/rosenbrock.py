"""One Rosenbrock step for one trajectory, written once for any tableau (``method.tableau``).

The linear algebra is passed in: ``jvals`` is the Jacobian in the linear solver's slot layout and
``linear`` factorises W = I/(hγ) − J in that layout and solves with it, so the same step runs on a
dense LU or on the compiled sparse LU.

Two equivalent forms of the stage loop: ``rosenbrock_step`` unrolls the stages at trace time
(every coefficient a literal, zero terms dropped), ``rosenbrock_step_looped`` runs them in a
``lax.fori_loop`` over the tableau's arrays so the RHS and the triangular solves appear once in the
compiled program instead of once per stage. XLA's CPU compile time grows steeply with program
size (a 64-variable lattice: 33 s unrolled vs a few s looped), so the JAX backend uses the looped
form; the CUDA kernel unrolls.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def rosenbrock_step(tab, f, linear, y, t, h, f0, jvals, dfdt):
    """Advance ``y`` from ``t`` by ``h``.

    f: callable (y, t) -> dy/dt as a 1-D array. f0 = f(y, t) (already computed with J).
    Returns (y_new, err_vec, K) with K the (3, n) dense-output coefficients.
    """
    s = tab.stages
    w = (-jvals).at[linear.diag_slots].add(1.0 / (h * tab.gamma))
    lu = linear.factor(w)
    ks = []
    for i in range(s):
        if i == 0:
            fi = f0
        else:
            yi = y
            for j in range(i):
                if tab.a[i, j] != 0.0:
                    yi = yi + tab.a[i, j] * ks[j]
            fi = f(yi, t + tab.c[i] * h)
        rhs = fi
        if tab.d[i] != 0.0:
            rhs = rhs + (h * tab.d[i]) * dfdt
        for j in range(i):
            if tab.C[i, j] != 0.0:
                rhs = rhs + (tab.C[i, j] / h) * ks[j]
        ks.append(linear.solve(lu, rhs))
    y_new = y
    err = jnp.zeros_like(y)
    for i in range(s):
        if tab.b[i] != 0.0:
            y_new = y_new + tab.b[i] * ks[i]
        if tab.e[i] != 0.0:
            err = err + tab.e[i] * ks[i]
    K = []
    for r in range(tab.H.shape[0]):
        acc = jnp.zeros_like(y)
        for i in range(s):
            acc = acc + tab.H[r, i] * ks[i]
        K.append(acc)
    return y_new, err, jnp.stack(K)


def rosenbrock_step_looped(tab, f, linear, y, t, h, f0, jvals, dfdt):
    """Same contract and result as ``rosenbrock_step``; stages in a ``fori_loop``."""
    s = tab.stages
    a = jnp.asarray(tab.a)
    C = jnp.asarray(tab.C)
    c = jnp.asarray(tab.c)
    d = jnp.asarray(tab.d)
    w = (-jvals).at[linear.diag_slots].add(1.0 / (h * tab.gamma))
    lu = linear.factor(w)
    k0 = linear.solve(lu, f0 + (h * tab.d[0]) * dfdt)
    K = jnp.zeros((s,) + y.shape, y.dtype).at[0].set(k0)

    def stage(i, K):
        yi = y + a[i] @ K
        rhs = f(yi, t + c[i] * h) + (h * d[i]) * dfdt + (C[i] / h) @ K
        return K.at[i].set(linear.solve(lu, rhs))

    K = jax.lax.fori_loop(1, s, stage, K)
    y_new = y + jnp.asarray(tab.b) @ K
    err = jnp.asarray(tab.e) @ K
    return y_new, err, jnp.asarray(tab.H) @ K


def dense_output(y0, y1, K, theta):
    """Continuous extension at θ ∈ [0, 1] (θ may be an array of shape (m,) → result (m, n))."""
    th = jnp.asarray(theta)[..., None]
    one_m = 1.0 - th
    return one_m * y0 + th * (y1 + one_m * (K[0] + th * (K[1] + th * K[2])))
