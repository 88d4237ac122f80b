"""Compiled sparse LU: AMD ordering, exact fill, generated code, JAX solves (solver.linalg.sparse_lu / linear)."""
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from solver.linalg.codegen import compile_functions
from solver.linalg.linear import build_linear_solver
from solver.linalg.sparse_lu import amd_order, generate_lu_source, symbolic_lu


def eb_like_pattern(core=12, tails=(8, 10, 12, 13, 15)):
    """Dense core + tridiagonal tails, each joined to one core variable by one entry each way."""
    n = core + sum(tails)
    pat = np.zeros((n, n), dtype=bool)
    pat[:core, :core] = True
    start = core
    for k, length in enumerate(tails):
        idx = np.arange(start, start + length)
        pat[idx, idx] = True
        pat[idx[:-1], idx[1:]] = True
        pat[idx[1:], idx[:-1]] = True
        anchor = core - 1 - k
        pat[anchor, idx[0]] = pat[idx[0], anchor] = True
        start += length
    return pat


def arrow_pattern(n=20):
    pat = np.eye(n, dtype=bool)
    pat[0, :] = pat[:, 0] = True
    return pat


def grid_laplacian_pattern(m=8):
    n = m * m
    pat = np.eye(n, dtype=bool)
    for r in range(m):
        for c in range(m):
            i = r * m + c
            if c + 1 < m:
                pat[i, i + 1] = pat[i + 1, i] = True
            if r + 1 < m:
                pat[i, i + m] = pat[i + m, i] = True
    return pat


def random_pattern(n, density, seed):
    return np.random.default_rng(seed).random((n, n)) < density


def brute_force_fill(pattern, order):
    """Dense boolean Gaussian elimination (no pivoting) on the permuted pattern: fill count."""
    n = pattern.shape[0]
    m = (pattern | np.eye(n, dtype=bool))[np.ix_(order, order)].copy()
    start = m.sum()
    for k in range(n):
        rows = np.nonzero(m[k + 1:, k])[0] + k + 1
        m[np.ix_(rows, np.arange(k + 1, n))] |= m[k, k + 1:]
    return int(m.sum() - start), m


def random_values(pattern, seed):
    """Diagonally dominant matrix with exactly this structure (well conditioned, no pivoting needed)."""
    rng = np.random.default_rng(seed)
    n = pattern.shape[0]
    a = np.where(pattern, rng.uniform(-1, 1, size=pattern.shape), 0.0)
    a[np.arange(n), np.arange(n)] = np.abs(a).sum(axis=1) + 1.0 + rng.random(n)
    return a


@pytest.mark.parametrize("name, pattern, expected_fill", [
    ("eb_like", eb_like_pattern(), 0),
    ("arrow", arrow_pattern(), 0),
    ("grid8x8", grid_laplacian_pattern(8), 356),
    ("random30", random_pattern(30, 0.1, 0), 77),
    ("random60", random_pattern(60, 0.05, 1), 453),
])
def test_fill_pinned_and_exact(name, pattern, expected_fill):
    sym = symbolic_lu(pattern)
    bf_fill, bf_full = brute_force_fill(pattern, sym.order)
    assert sym.n_fill == bf_fill, name
    # the slot set equals the brute-force L+U pattern
    got = np.zeros_like(bf_full)
    got[sym.position[sym.slot_rows], sym.position[sym.slot_cols]] = True
    np.testing.assert_array_equal(got, bf_full)
    assert sym.n_fill == expected_fill, (name, sym.n_fill)


def test_amd_zero_fill_where_natural_order_fills():
    pat = arrow_pattern(20)
    natural = symbolic_lu(pat, order=np.arange(20))
    assert natural.n_fill == 19 * 18  # dense row/column 0 eliminated first fills everything
    assert symbolic_lu(pat).n_fill == 0
    assert sorted(amd_order(pat).tolist()) == list(range(20))


def test_slot_layout_consistent():
    pat = eb_like_pattern()
    sym = symbolic_lu(pat)
    assert sym.nnz == int((pat | np.eye(70, dtype=bool)).sum()) + sym.n_fill
    for (i, j), s in sym.slot_of.items():
        assert (sym.slot_rows[s], sym.slot_cols[s]) == (i, j)
    np.testing.assert_array_equal(sym.slot_rows[sym.diag_slots], np.arange(70))
    np.testing.assert_array_equal(sym.slot_cols[sym.diag_slots], np.arange(70))


@pytest.mark.parametrize("pattern", [eb_like_pattern(), random_pattern(40, 0.08, 2),
                                     random_pattern(25, 0.2, 3)],
                         ids=["eb_like", "random40", "random25"])
def test_generated_python_solve_matches_scipy(pattern):
    solver = build_linear_solver(pattern, method="sparse")
    sym = solver.symbolic
    n = sym.n
    fns = compile_functions(solver.source, ["lu_factor", "lu_solve"], "test_sparse_lu")
    for seed in range(3):
        a = random_values(pattern | np.eye(n, dtype=bool), seed)
        b = np.random.default_rng(100 + seed).normal(size=n)
        lu = fns["lu_factor"](list(solver.from_dense(a)))
        x = np.array(fns["lu_solve"](lu, list(b)))
        ref = scipy.linalg.lu_solve(scipy.linalg.lu_factor(a), b)
        assert np.max(np.abs(x - ref)) <= 1e-12 * np.max(np.abs(ref))


@pytest.mark.parametrize("method", ["sparse", "dense"])
def test_jax_solve_jit_vmap(method):
    pattern = eb_like_pattern()
    solver = build_linear_solver(pattern, method=method)
    n = solver.n
    mats = np.stack([random_values(pattern | np.eye(n, dtype=bool), s) for s in range(4)])
    rhs = np.random.default_rng(7).normal(size=(4, n))
    w = np.stack([solver.from_dense(m) for m in mats])

    @jax.jit
    @jax.vmap
    def factor_solve(w_, b_):
        return solver.solve(solver.factor(w_), b_)

    x = np.asarray(factor_solve(jnp.asarray(w), jnp.asarray(rhs)))
    ref = np.stack([np.linalg.solve(m, b) for m, b in zip(mats, rhs)])
    np.testing.assert_allclose(x, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_fill_slots_in_input_are_ignored():
    pattern = random_pattern(30, 0.1, 0)
    solver = build_linear_solver(pattern, method="sparse")
    a = random_values(pattern | np.eye(30, dtype=bool), 0)
    w = solver.from_dense(a)
    dirty = w.copy()
    dirty[solver.is_fill] = 1e3
    b = np.ones(30)
    x_clean = solver.solve(solver.factor(jnp.asarray(w)), b)
    x_dirty = solver.solve(solver.factor(jnp.asarray(dirty)), b)
    np.testing.assert_array_equal(np.asarray(x_clean), np.asarray(x_dirty))


def test_all_jax_impls_agree():
    pattern = random_pattern(12, 0.25, 4)  # small: the unrolled form is slow for XLA to compile
    unrolled = build_linear_solver(pattern, method="sparse", jax_impl="unrolled")
    levels = build_linear_solver(pattern, method="sparse")
    table = build_linear_solver(pattern, method="sparse", unroll_max_ops=1)
    assert unrolled.method == "sparse-unrolled" and table.method == "sparse-table"
    assert levels.method == "sparse"
    a = random_values(pattern | np.eye(12, dtype=bool), 5)
    w = jnp.asarray(unrolled.from_dense(a))
    lu_u = np.asarray(unrolled.factor(w))
    np.testing.assert_allclose(np.asarray(levels.factor(w)), lu_u, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(np.asarray(table.factor(w)), lu_u, rtol=1e-14, atol=1e-15)


def test_table_driven_matches_unrolled():
    pattern = random_pattern(40, 0.08, 2)
    unrolled = build_linear_solver(pattern, method="sparse")
    table = build_linear_solver(pattern, method="sparse", unroll_max_ops=1)
    a = random_values(pattern | np.eye(40, dtype=bool), 5)
    w = jnp.asarray(unrolled.from_dense(a))
    b = jnp.asarray(np.random.default_rng(1).normal(size=40))
    x_u = unrolled.solve(unrolled.factor(w), b)  # level-scheduled, eager
    x_t = jax.jit(lambda w_, b_: table.solve(table.factor(w_), b_))(w, b)
    np.testing.assert_allclose(np.asarray(x_t), np.asarray(x_u), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray(x_t), np.linalg.solve(a, np.asarray(b)), rtol=1e-12)


def test_generated_code_in_traceback():
    pattern = eb_like_pattern()
    solver = build_linear_solver(pattern, method="sparse")
    fns = compile_functions(solver.source, ["lu_factor"], "sparse_lu traceback-test")
    a = [1.0] * solver.nslots
    a[int(solver.symbolic.slot_of[(int(solver.symbolic.order[0]),) * 2])] = 0.0  # zero first pivot
    with pytest.raises(ZeroDivisionError) as info:
        fns["lu_factor"](a)
    text = "".join(traceback.format_exception(info.value))
    assert "<generated sparse_lu traceback-test" in text
    assert "= 1.0 / a" in text  # the generated line itself is shown


def test_linear_solver_bad_input():
    with pytest.raises(ValueError, match="method"):
        build_linear_solver(np.eye(3, dtype=bool), method="cholesky")
    with pytest.raises(ValueError, match="square"):
        build_linear_solver(np.ones((3, 4), dtype=bool))
    with pytest.raises(ValueError, match="permutation"):
        symbolic_lu(np.eye(3, dtype=bool), order=[0, 0, 1])


def test_auto_method_and_source_exposed():
    assert build_linear_solver(np.eye(4, dtype=bool)).method == "dense"
    solver = build_linear_solver(eb_like_pattern())
    assert solver.method == "sparse"
    assert "def lu_factor(a):" in solver.source and "def lu_solve(lu, b):" in solver.source
    factor_src, solve_src = generate_lu_source(solver.symbolic)
    body = [ln for ln in (factor_src + solve_src).splitlines() if not ln.strip().startswith(('"""', "#"))]
    assert not any(ln.lstrip().startswith(("for ", "while ")) for ln in body)  # straight-line
