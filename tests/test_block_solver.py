"""The forward-sensitivity solve's structured linear algebra
(solver.linalg.linear.build_block_triangular_solver,
solver.linalg.jacobian.build_jacobian_plan(seed_columns=)): exact against dense numpy on random
data."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from solver.linalg.jacobian import build_jacobian_plan
from solver.linalg.linear import build_block_triangular_solver


def _random_case(n, m, seed, density=0.3):
    rng = np.random.default_rng(seed)
    base = (rng.random((n, n)) < density) | np.eye(n, dtype=bool)
    coupling = base & (rng.random((n, n)) < 0.6)
    return rng, base, coupling


@pytest.mark.parametrize("method, n, m", [("dense", 4, 3), ("sparse", 12, 1), ("sparse", 12, 4)])
def test_block_triangular_solve_equals_dense(method, n, m):
    """W = [[W0, 0], [C_d, W0]] (C_d = W's (s_d, y) block, equal values for every d's pattern):
    factor + solve through the slot layout equals numpy's dense solve of the whole matrix."""
    rng, base, coupling = _random_case(n, m, seed=n + m)
    lin = build_block_triangular_solver(base, coupling, m, method=method)
    N = n * (1 + m)
    W = np.zeros((N, N))
    W0 = np.where(base, rng.normal(size=(n, n)), 0.0) + 5.0 * np.eye(n)
    for d in range(m + 1):
        W[d * n:(d + 1) * n, d * n:(d + 1) * n] = W0
    for d in range(m):
        W[(d + 1) * n:(d + 2) * n, :n] = np.where(coupling, rng.normal(size=(n, n)), 0.0)
    assert lin.n == N and np.array_equal(lin.slot_rows[lin.diag_slots], np.arange(N))
    assert np.array_equal(lin.slot_cols[lin.diag_slots], np.arange(N))
    w = W[lin.slot_rows, lin.slot_cols]
    b = rng.normal(size=N)
    x = np.asarray(jax.jit(lambda w, b: lin.solve(lin.factor(w), b))(w, b))
    np.testing.assert_allclose(x, np.linalg.solve(W, b), rtol=1e-10, atol=1e-12)
    # every entry of W outside the s blocks' off-diagonal copies of W0 has a slot
    covered = np.zeros((N, N), bool)
    covered[lin.slot_rows, lin.slot_cols] = True
    need = W != 0
    for d in range(m):
        r = slice((d + 1) * n, (d + 2) * n)
        need[r, r] = np.eye(n, dtype=bool)
    assert not np.any(need & ~covered)


def test_block_solver_rejects_bad_input():
    base = np.eye(3, dtype=bool)
    with pytest.raises(ValueError, match="coupling"):
        build_block_triangular_solver(base, np.eye(2, dtype=bool), 2)
    with pytest.raises(ValueError, match="m >= 1"):
        build_block_triangular_solver(base, base, 0)


def test_seed_columns_reads_only_seeded_columns():
    """A rhs whose unseeded columns are dense: the gathered slots of the seeded columns are exact
    (nothing leaks in from the unseeded ones), the rest are zero."""
    import jax.numpy as jnp

    n = 6
    A = np.arange(1.0, n * n + 1).reshape(n, n)
    seeded = np.array([0, 2, 3])

    def rhs(y, t, p):
        return tuple(jnp.sin(jnp.asarray(A) @ y)[i] for i in range(n))

    full = np.ones((n, n), bool)
    pat = np.zeros((n, n), bool)
    pat[:, seeded] = True
    rows, cols = np.nonzero(full)
    plan = build_jacobian_plan(pat, slot_rows=rows, slot_cols=cols, seed_columns=seeded)
    y = np.linspace(0.1, 0.6, n)
    jv, _ = plan.jac_and_dfdt(rhs, jnp.asarray(y), 0.0, jnp.zeros(1))
    J = np.asarray(jax.jacfwd(lambda y: jnp.sin(jnp.asarray(A) @ y))(jnp.asarray(y)))
    got = np.zeros((n, n))
    got[rows, cols] = np.asarray(jv)
    np.testing.assert_allclose(got[:, seeded], J[:, seeded], rtol=1e-13)
    assert np.all(got[:, [1, 4, 5]] == 0.0)
    with pytest.raises(ValueError, match="seed_columns"):
        build_jacobian_plan(full, slot_rows=rows, slot_cols=cols, seed_columns=seeded)
