"""Structural sparsity detection by jaxpr dependency tracing (solver.linalg.sparsity)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solver.linalg.sparsity import detect_dependence, detect_sparsity, detect_time_dependence, validate_pattern


def robertson(y, t, p):
    return (-p[0] * y[0] + p[1] * y[1] * y[2],
            p[0] * y[0] - p[1] * y[1] * y[2] - p[2] * y[1] ** 2,
            p[2] * y[1] ** 2)


def jac_at(rhs, y, t, p, args=None):
    def f(y_):
        out = rhs(y_, t, p) if args is None else rhs(y_, t, p, args)
        return jnp.stack([jnp.asarray(v, dtype=jnp.float64) for v in out])
    return np.asarray(jax.jacfwd(f)(jnp.asarray(y)))


def test_robertson():
    pat = detect_sparsity(robertson, 3, 3)
    expected = np.array([[1, 1, 1], [1, 1, 1], [0, 1, 0]], dtype=bool)
    np.testing.assert_array_equal(pat, expected)
    _, dt, dp = detect_dependence(robertson, 3, 3)
    assert not dt.any()
    np.testing.assert_array_equal(dp, [[1, 1, 0], [1, 1, 1], [0, 0, 1]])


def tridiagonal_lattice(n):
    def rhs(y, t, p):
        out = []
        for i in range(n):
            left = y[i - 1] if i > 0 else 0.0
            right = y[i + 1] if i < n - 1 else 0.0
            out.append(p[0] * (left - 2.0 * y[i] + right) - p[1] * y[i] ** 3)
        return tuple(out)
    return rhs


def test_tridiagonal_lattice():
    n = 20
    pat = detect_sparsity(tridiagonal_lattice(n), n, 2)
    expected = np.eye(n, dtype=bool) | np.eye(n, k=1, dtype=bool) | np.eye(n, k=-1, dtype=bool)
    np.testing.assert_array_equal(pat, expected)


def random_polynomial_rhs(pattern, seed):
    """f_i = sum_j c_ij y_j^2 + d_i prod_j y_j (over the row's columns) -- literal indices only."""
    rng = np.random.default_rng(seed)
    rows = [np.nonzero(r)[0].tolist() for r in pattern]
    coef = [rng.uniform(0.5, 2.0, size=len(r)).tolist() for r in rows]

    def rhs(y, t, p, args):
        table = args["table"]
        idx = jnp.clip(jnp.asarray(t * 8.0).astype(jnp.int32), 0, 7)  # table lookup with a t-derived index
        out = []
        for i, (cols, cs) in enumerate(zip(rows, coef)):
            acc = 0.0 * p[0]
            prod = 1.0
            for j, c in zip(cols, cs):
                acc = acc + c * y[j] ** 2
                prod = prod * y[j]
            scale = jnp.where(t > 0.5, table[idx], jnp.exp(p[0]))
            out.append(acc * scale + 0.3 * prod)
        return tuple(out)
    return rhs


@pytest.mark.parametrize("seed", [0, 1])
def test_random_structure_equals_jacfwd(seed):
    n = 25
    rng = np.random.default_rng(seed)
    pattern = rng.random((n, n)) < 0.12
    rhs = random_polynomial_rhs(pattern, seed)
    args = {"table": jnp.asarray(rng.uniform(1.0, 2.0, size=8))}
    detected = detect_sparsity(rhs, n, 1, args)
    np.testing.assert_array_equal(detected, pattern)
    for k in range(3):
        y = rng.uniform(0.5, 1.5, size=n)
        t = float(rng.uniform(0, 1))
        jac = jac_at(rhs, y, t, jnp.array([0.1]), args)
        assert not np.any((jac != 0) & ~detected)  # numerical nonzeros are inside the pattern
        np.testing.assert_array_equal(jac != 0, pattern)  # and equal it for generic values


def test_where_exp_tables_gather_and_time():
    def rhs(y, t, p, args):
        tab = args
        grid = jnp.linspace(0.0, 1.0, 10)
        return (jnp.where(t > 1.0, y[0], jnp.exp(y[1])),           # both branches count
                y[2:4].sum(),                                         # slice + reduce
                jnp.interp(t, grid, tab) * y[3],                      # table in t, y[3]
                y[jnp.array([1, 2])].sum(),                           # gather, constant indices
                jnp.dot(jnp.array([1.0, 2.0]), jnp.stack([y[0], y[4]])) + p[0] * 0.0)
    dy, dt, dp = detect_dependence(rhs, 5, 1, jnp.ones(10))
    expected = np.zeros((5, 5), dtype=bool)
    expected[0, [0, 1]] = expected[1, [2, 3]] = expected[2, 3] = expected[3, [1, 2]] = True
    expected[4, [0, 4]] = True
    np.testing.assert_array_equal(dy, expected)
    np.testing.assert_array_equal(dt, [False, False, True, False, False])
    assert detect_time_dependence(rhs, 5, 1, jnp.ones(10))[2]


def test_control_flow_is_conservative_superset():
    def rhs(y, t, p):
        s = jax.lax.fori_loop(0, 3, lambda i, acc: acc * y[1], y[0])
        c = jax.lax.cond(t > 0, lambda a: a[0] * 2.0, lambda a: a[1], (y[2], y[3]))
        return (s, c, y[2], y[3])
    pat = detect_sparsity(rhs, 4, 0)
    assert pat[0, 0] and pat[0, 1] and not pat[0, 2:].any()
    assert pat[1, 2] and pat[1, 3] and not pat[1, :2].any()


def test_validate_pattern():
    pat = validate_pattern(np.array([[0, 1], [0, 0]]), 2)
    np.testing.assert_array_equal(pat, [[1, 1], [0, 1]])
    with pytest.raises(ValueError, match="shape"):
        validate_pattern(np.ones((2, 3), dtype=bool), 2)
    with pytest.raises(ValueError, match="0 and 1"):
        validate_pattern(np.array([[0, 2], [0, 0]]), 2)
    with pytest.raises(ValueError, match="dtype"):
        validate_pattern(np.array([["a", "b"], ["c", "d"]]), 2)


def test_wrong_output_count():
    with pytest.raises(ValueError, match="tuple of n scalars"):
        detect_sparsity(robertson, 4, 3)
