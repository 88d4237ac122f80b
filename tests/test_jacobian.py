"""Compressed jvp Jacobians decompressed into linear-solver slots (solver.linalg.jacobian)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solver.linalg.jacobian import assemble_w, build_jacobian_plan
from solver.linalg.linear import build_linear_solver
from solver.linalg.sparsity import detect_sparsity


def robertson(y, t, p):
    return (-p[0] * y[0] + p[1] * y[1] * y[2],
            p[0] * y[0] - p[1] * y[1] * y[2] - p[2] * y[1] ** 2,
            p[2] * y[1] ** 2)


def vdp_lattice(n_osc):
    def rhs(y, t, p):
        out = []
        for k in range(n_osc):
            x, v = y[2 * k], y[2 * k + 1]
            left = y[2 * k - 2] if k > 0 else 0.0
            right = y[2 * k + 2] if k < n_osc - 1 else 0.0
            out.append(v)
            out.append(p[0] * (1.0 - x ** 2) * v - x + p[1] * (left - 2.0 * x + right))
        return tuple(out)
    return rhs


def eb_like_rhs(core=12, tails=(8, 10, 12, 13, 15), seed=0):
    """Random nonlinear rhs with the EB structure: dense core, tridiagonal tails joined by one entry."""
    rng = np.random.default_rng(seed)
    n = core + sum(tails)
    c = rng.uniform(-1, 1, size=(core, core)).tolist()
    anchors, starts = [], []
    start = core
    for k, length in enumerate(tails):
        anchors.append(core - 1 - k)
        starts.append((start, length))
        start += length

    def rhs(y, t, p):
        out = [None] * n
        for i in range(core):
            acc = jnp.sin(t) * p[0] * y[i]
            for j in range(core):
                acc = acc + c[i][j] * y[j] * (1.0 + 0.1 * y[i])
            out[i] = acc
        for (s, length), a in zip(starts, anchors):
            out[a] = out[a] + 0.5 * y[s]
            for m in range(length):
                i = s + m
                prev = y[a] if m == 0 else y[i - 1]
                nxt = y[i + 1] if m < length - 1 else 0.0
                out[i] = p[1] * (prev - nxt) * (m + 1) - p[2] * y[i] * jnp.exp(-t)
        return tuple(out)
    return rhs, n


def jacfwd_dense(rhs, y, t, p):
    return np.asarray(jax.jacfwd(lambda y_: jnp.stack(rhs(y_, t, p)))(y))


CASES = {
    "robertson": (robertson, 3, jnp.array([0.04, 1e4, 3e7]), 1e-13),
    "vdp_lattice": (vdp_lattice(32), 64, jnp.array([5.0, 0.7]), 1e-13),
    "eb_like": (eb_like_rhs()[0], 70, jnp.array([0.3, 1.2, 0.8]), 1e-13),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("method", ["sparse", "dense"])
def test_jacobian_matches_jacfwd(name, method):
    rhs, n, p, tol = CASES[name]
    pattern = detect_sparsity(rhs, n, p.size)
    solver = build_linear_solver(pattern, method=method)
    plan = build_jacobian_plan(pattern, solver)
    rng = np.random.default_rng(1)
    fn = jax.jit(lambda y_, t_: plan.jac_and_dfdt(rhs, y_, t_, p))
    for _ in range(2):
        y = jnp.asarray(rng.uniform(0.1, 1.0, size=n))
        t = 0.37
        jvals, dfdt = fn(y, t)
        ref = jacfwd_dense(rhs, y, t, p)
        got = solver.to_dense(np.asarray(jvals))
        scale = max(1.0, np.abs(ref).max())
        assert np.max(np.abs(got - ref)) <= tol * scale
        ref_t = np.asarray(jax.jacfwd(lambda t_: jnp.stack(rhs(y, t_, p)))(t))
        np.testing.assert_allclose(np.asarray(dfdt), ref_t, rtol=1e-13, atol=1e-14)
        assert np.all(np.asarray(jvals)[solver.is_fill] == 0.0)


def test_eb_like_colours_and_time_derivative_nonzero():
    rhs, n = eb_like_rhs()
    p = jnp.array([0.3, 1.2, 0.8])
    pattern = detect_sparsity(rhs, n, 3)
    plan = build_jacobian_plan(pattern, build_linear_solver(pattern))
    assert plan.n_colors == 13  # = max nonzeros per row (core anchor rows)
    _, dfdt = jax.jit(lambda y_: plan.jac_and_dfdt(rhs, y_, 0.2, p))(jnp.ones(n))
    assert np.all(np.asarray(dfdt) != 0.0)


def test_loop_and_vmap_modes_agree_and_vmap_over_ensemble():
    rhs, n, p = vdp_lattice(6), 12, jnp.array([5.0, 0.7])
    pattern = detect_sparsity(rhs, n, p.size)
    solver = build_linear_solver(pattern)
    plan_v = build_jacobian_plan(pattern, solver, mode="vmap")
    plan_l = build_jacobian_plan(pattern, solver, mode="loop")
    ys = jnp.asarray(np.random.default_rng(2).uniform(-1, 1, size=(5, n)))
    ts = jnp.linspace(0.0, 1.0, 5)
    batched_v = jax.jit(jax.vmap(lambda y_, t_: plan_v.f_jac_and_dfdt(rhs, y_, t_, p)))
    batched_l = jax.jit(jax.vmap(lambda y_, t_: plan_l.f_jac_and_dfdt(rhs, y_, t_, p)))
    for a, b in zip(batched_v(ys, ts), batched_l(ys, ts)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-15, atol=1e-15)
    f_val = batched_v(ys, ts)[0]
    np.testing.assert_allclose(np.asarray(f_val[1]), np.asarray(jnp.stack(rhs(ys[1], ts[1], p))))


def test_assemble_w_and_solve():
    rhs, n, p, _ = CASES["eb_like"]
    pattern = detect_sparsity(rhs, n, p.size)
    solver = build_linear_solver(pattern)
    plan = build_jacobian_plan(pattern, solver)
    y = jnp.asarray(np.random.default_rng(3).uniform(0.1, 1, size=n))
    jvals, _ = jax.jit(lambda y_: plan.jac_and_dfdt(rhs, y_, 0.1, p))(y)
    inv_h_gamma = 50.0
    w = assemble_w(jvals, solver.diag_slots, inv_h_gamma)
    dense_w = inv_h_gamma * np.eye(n) - jacfwd_dense(rhs, y, 0.1, p)
    b = jnp.arange(n, dtype=jnp.float64)
    x = solver.solve(solver.factor(w), b)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(dense_w, np.asarray(b)), rtol=1e-11)


def test_plan_rejects_bad_input():
    pattern = np.eye(3, dtype=bool)
    with pytest.raises(ValueError, match="mode"):
        build_jacobian_plan(pattern, mode="reverse")
    with pytest.raises(ValueError, match="orthogonal"):
        build_jacobian_plan(np.ones((3, 3), dtype=bool), colors=np.array([0, 0, 1]))
    solver = build_linear_solver(np.eye(3, dtype=bool), method="sparse")
    with pytest.raises(ValueError, match="lacks pattern entries"):
        build_jacobian_plan(np.ones((3, 3), dtype=bool), solver)
