"""boltzmann.small_linalg: the straight-line pivoted LU of the recombination steps solves what
LAPACK solves, pivots where elimination without pivoting would fail, and differentiates."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boltzmann.small_linalg import lu_factor_small, lu_solve_small, solve_small


@pytest.mark.parametrize("n", [2, 3, 6])
def test_matches_numpy_on_badly_scaled_systems(n):
    rng = np.random.default_rng(n)
    for _ in range(5):
        # columns spanning six decades, as in I - h (A ⊗ J) where the Compton rate is stiff
        a = rng.normal(size=(n, n)) * np.logspace(0, 6, n)[None, :]
        b = rng.normal(size=n)
        x = np.asarray(solve_small(jnp.asarray(a), jnp.asarray(b)))
        ref = np.linalg.solve(a, b)
        assert np.abs(x - ref).max() <= 1e-12 * np.abs(ref).max()


def test_pivots_a_zero_leading_entry():
    a = np.array([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [3.0, 0.0, 1.0]])
    b = np.array([1.0, 2.0, 3.0])
    lu, perm = lu_factor_small(jnp.asarray(a))
    assert int(perm[0]) == 2                       # the largest |entry| of column 0
    np.testing.assert_allclose(np.asarray(lu_solve_small((lu, perm), b)),
                               np.linalg.solve(a, b), rtol=1e-14)


def test_derivative_is_that_of_the_inverse():
    rng = np.random.default_rng(7)
    a = rng.normal(size=(6, 6)) + 6.0 * np.eye(6)
    b = rng.normal(size=6)
    da = rng.normal(size=(6, 6))
    _, dx = jax.jvp(lambda m: solve_small(m, jnp.asarray(b)), (jnp.asarray(a),), (jnp.asarray(da),))
    x = np.linalg.solve(a, b)
    np.testing.assert_allclose(np.asarray(dx), -np.linalg.solve(a, da @ x), rtol=1e-11, atol=1e-13)
