"""A vmapped likelihood callback with a batched host function (boltzmann.likelihood): one host
call per batch of θ's, the same values and exact gradients as θ by θ, the cache shared with
single calls. A toy model stands in for the Boltzmann solve (PowerSpectrumModel.many is that
host function for P(k); its batching is tests/test_gradients_batch.py's)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boltzmann.likelihood import CachedJacobian, callback_function, gaussian_loglike

X = jnp.linspace(0.0, 2.0, 9)


def toy(theta):
    return theta[0] * jnp.exp(-theta[1] * X) + theta[2] * X ** 2


TH = jnp.array([[2.0, 0.7, 0.3], [1.5, 0.2, 0.1], [2.5, 1.1, -0.2], [1.0, 0.5, 0.5]])
SIG = 0.05 * (1.0 + X)
DATA = toy(TH[0])


def _callbacks():
    single = jax.jit(lambda th: (toy(th), jax.jacfwd(toy)(th)))
    calls = []

    def batched(ths):
        calls.append(np.shape(ths))
        return jax.vmap(single)(jnp.asarray(ths))

    cached = CachedJacobian(single, (X.size,), 3, batched=batched)
    return callback_function(cached), cached, calls


def test_vmap_is_one_host_call_with_exact_values_and_gradients():
    f_cb, cached, calls = _callbacks()
    np.testing.assert_allclose(jax.vmap(f_cb)(TH), jax.vmap(toy)(TH), rtol=1e-14)
    assert calls == [(4, 3)] and cached.n_batched_calls == 1 and cached.n_solves == 4
    L_cb, L = gaussian_loglike(f_cb, DATA, SIG), gaussian_loglike(toy, DATA, SIG)
    g = jax.jit(jax.vmap(jax.grad(L_cb)))(TH)
    np.testing.assert_allclose(g, jax.vmap(jax.grad(L))(TH), rtol=1e-12)
    assert calls == [(4, 3)]                 # the gradients came from the cache
    # a single call at a batch member is a cache hit; a new θ is a single solve
    f_cb(TH[2])
    assert cached.n_solves == 4
    f_cb(TH[2] * 1.01)
    assert cached.n_solves == 5 and cached.n_batched_calls == 1


def test_repeated_thetas_are_solved_once_and_bad_shapes_are_errors():
    _, cached, calls = _callbacks()
    ys, jacs = cached.many(np.asarray(TH)[[0, 1, 0, 1]])
    assert calls == [(2, 3)] and ys.shape == (4, X.size) and jacs.shape == (4, X.size, 3)
    np.testing.assert_array_equal(ys[0], ys[2])
    with pytest.raises(ValueError, match=r"\(B, 3\)"):
        cached.many(np.ones(3))


def test_without_a_batched_function_vmap_runs_theta_by_theta():
    single = jax.jit(lambda th: (toy(th), jax.jacfwd(toy)(th)))
    cached = CachedJacobian(single, (X.size,), 3)
    f_cb = callback_function(cached)
    np.testing.assert_allclose(jax.vmap(f_cb)(TH), jax.vmap(toy)(TH), rtol=1e-14)
    assert cached.n_batched_calls == 0 and cached.n_solves == 4
