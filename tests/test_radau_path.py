"""The thermodynamics' node-to-node integration: the linearised tangents of boltzmann.radau_path
against forward mode through the sequential loop, the affine recurrence against a loop, and the
thermodynamics table's derivatives in the cosmological parameters against finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boltzmann import recombination as rec
from boltzmann.radau_path import affine_recurrence, radau_path
from boltzmann.thermodynamics import LoopShape, default_grid, thermodynamics_from_hubble

jax.config.update("jax_enable_x64", True)


def test_affine_recurrence_equals_a_loop():
    rng = np.random.default_rng(1)
    N = 37
    phi, beta, x0 = rng.normal(size=N), rng.normal(size=N), 0.7
    x, ref = x0, []
    for n in range(N):
        x = phi[n] * x + beta[n]
        ref.append(x)
    assert np.allclose(affine_recurrence(jnp.asarray(phi), jnp.asarray(beta), x0), ref,
                       rtol=1e-12, atol=1e-12)
    phi = 0.5 * rng.normal(size=(N, 3, 3))
    beta, x0 = rng.normal(size=(N, 3)), rng.normal(size=3)
    x, ref = x0, []
    for n in range(N):
        x = phi[n] @ x + beta[n]
        ref.append(x)
    got = affine_recurrence(jnp.asarray(phi), jnp.asarray(beta), jnp.asarray(x0))
    assert np.allclose(got, np.array(ref), rtol=1e-12, atol=1e-12)


def _stiff_rhs(t, y, s, q):
    """A stiff nonlinear 3-state system that reads a time-only input s and parameters q."""
    k1, k2 = q
    return jnp.stack([-k1 * s * y[0] + k2 * y[1] * y[2],
                      k1 * s * y[0] - k2 * y[1] * y[2] - 3e3 * y[1] ** 2 * (1.0 + 0.1 * jnp.sin(t)),
                      3e3 * y[1] ** 2 * (1.0 + 0.1 * jnp.sin(t))])


def _problem(theta):
    t = jnp.linspace(0.0, 2.0, 61)
    t_lo, t_hi = t[:-1], t[1:]
    c = jnp.asarray(rec.RADAU_C)
    stage = [1.0 + theta[2] * (t_lo + c[i] * (t_hi - t_lo)) ** 2 for i in range(2)]
    y0 = jnp.array([1.0, 0.0, 0.0]) * (1.0 + theta[3])
    return t_lo, t_hi, y0, stage, (theta[0], theta[1])


def _sequential(theta):
    """The same steps as one scan, differentiated through (the reference)."""
    t_lo, t_hi, y0, stage, q = _problem(theta)

    def step(y, xs):
        t0, t1, s0, s1 = xs
        y1 = rec.radau_step(lambda t, u, s: _stiff_rhs(t, u, s, q), t0, y, t1 - t0,
                            stage_args=((s0,), (s1,)))
        return y1, y1
    return jax.lax.scan(step, y0, (t_lo, t_hi, stage[0], stage[1]))[1]


def _linearised(theta):
    t_lo, t_hi, y0, stage, q = _problem(theta)
    return radau_path(_stiff_rhs, t_lo, t_hi, y0, stage, q, LoopShape())[0]


def _sequential_derivatives(theta):
    """The step ends' collocation derivatives, (A⁻¹ Z)_2 / h, from the plain loop's stages."""
    t_lo, t_hi, y0, stage, q = _problem(theta)

    def step(y, xs):
        t0, t1, s0, s1 = xs
        y1, z = rec.radau_step(lambda t, u, s: _stiff_rhs(t, u, s, q), t0, y, t1 - t0,
                               stage_args=((s0,), (s1,)), return_stages=True)
        a_inv = jnp.linalg.inv(jnp.asarray(rec.RADAU_A))[1]
        return y1, (a_inv[0] * z[0] + a_inv[1] * z[1]) / (t1 - t0)
    return jax.lax.scan(step, y0, (t_lo, t_hi, stage[0], stage[1]))[1]


def test_radau_path_derivatives_are_the_collocation_derivatives_and_their_tangents():
    """The path's d/dt at the step ends is the collocation polynomial's, which equals the rhs at
    the new state to the Newton iteration's residual; its tangents equal forward mode through
    the loop's stages."""
    theta = jnp.array([0.04, 1e4, 0.3, 0.1])
    t_lo, t_hi, y0, stage, q = _problem(theta)
    ys, dys = radau_path(_stiff_rhs, t_lo, t_hi, y0, stage, q, LoopShape())
    np.testing.assert_allclose(np.asarray(dys), np.asarray(_sequential_derivatives(theta)),
                               rtol=1e-12, atol=1e-12 * float(jnp.max(jnp.abs(dys))))
    rhs_end = jax.vmap(lambda t, y, s: _stiff_rhs(t, y, s, q))(t_hi, ys, stage[1])
    scale = float(jnp.max(jnp.abs(rhs_end)))
    assert float(jnp.max(jnp.abs(dys - rhs_end))) < 1e-6 * scale
    jac = jax.jacfwd(lambda th: radau_path(_stiff_rhs, *_problem(th), LoopShape())[1])(theta)
    jac_ref = jax.jacfwd(_sequential_derivatives)(theta)
    scale = np.abs(np.asarray(jac_ref)).max(axis=(0, 1))
    err = np.abs(np.asarray(jac) - np.asarray(jac_ref)).max(axis=(0, 1)) / scale
    assert np.all(err < 1e-6), err


def test_radau_path_tangents_match_forward_mode_through_the_loop():
    theta = jnp.array([0.04, 1e4, 0.3, 0.1])
    ys, ref = _linearised(theta), _sequential(theta)
    assert np.array_equal(np.asarray(ys), np.asarray(ref))
    jac = jax.jacfwd(_linearised)(theta)
    jac_ref = jax.jacfwd(_sequential)(theta)
    scale = np.abs(np.asarray(jac_ref)).max(axis=(0, 1))
    err = np.abs(np.asarray(jac) - np.asarray(jac_ref)).max(axis=(0, 1)) / scale
    # the loop differentiates six simplified-Newton iterations, the linearisation the converged
    # stages: they agree to the iteration's residual (~1e-8 at these coarse steps)
    assert np.all(err < 1e-7), err
    # reverse mode through the linearised jvp (transposed) gives the same gradient
    g = jax.grad(lambda th: jnp.sum(_linearised(th)[-1] ** 2))(theta)
    g_ref = jax.grad(lambda th: jnp.sum(_sequential(th)[-1] ** 2))(theta)
    assert np.allclose(g, g_ref, rtol=1e-8, atol=0)


def test_derivative_columns_are_smooth_after_the_saha_switch():
    """Just after the rate equations take over from the Saha start (z = 4000 down to 3500, a
    step per node), d x_e/dlna and d ln κ'/dlna are the solution's, not the stiff rhs at each
    step's end (which multiplied the Newton iteration's residual by the rates into a noise of
    ~5e-2 in d x_e/dlna, where x_e changes by 1e-6 per unit ln a): they match centred
    differences of the tabulated x_e and ln κ'."""
    H0 = 67.0 / 299792.458
    hub = lambda a: H0 * jnp.sqrt(0.31 / a**3 + 9e-5 / a**4 + 0.69)  # noqa: E731
    # compiled: the same program as eager dispatch op by op, in a sixth of the time
    t = jax.jit(lambda: thermodynamics_from_hubble(hub, 0.0224, 0.245, 2.7255, 0.055))()
    lna = np.asarray(t.lna)
    z = np.expm1(-lna)
    inner = np.nonzero((z > 3500.0) & (z < 4100.0))[0]
    # centred differences are off by h²/6 times the third derivative: 1-2 % of d x_e/dlna
    # as helium recombination starts, 1e-6 of d ln κ'/dlna ≈ -2
    for value, deriv, rel in ((t.x_e, t.dx_e, 2e-2), (t.ln_kappa_dot, t.dln_kappa_dot, 1e-4)):
        v, d = np.asarray(value), np.asarray(deriv)
        fd = (v[inner + 1] - v[inner - 1]) / (lna[inner + 1] - lna[inner - 1])
        err = np.abs(d[inner] - fd) - rel * np.abs(fd)
        assert np.max(err) < 1e-8, np.max(err)


#: stride 2 (the default's) runs both paths: a step per node down to z_stride_start, two
#: nodes a step below it; stride 1 alone is the slow set's
@pytest.mark.parametrize("stride", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_thermodynamics_tangents_match_finite_differences(stride):
    """The tables' x_e, T_b and kappa' derivatives in omega_b and Y_He (through the linearised
    recombination tangents) against central differences, from recombination to reionisation,
    with a Radau step per node and over two nodes (the interpolated nodes between)."""
    H0 = 67.0 / 299792.458

    def table(x):
        hub = lambda a: H0 * jnp.sqrt(0.31 / a**3 + 9e-5 / a**4 + 0.69)  # noqa: E731
        t = thermodynamics_from_hubble(hub, x[0], x[1], 2.7255, 0.055, ode_stride=stride)
        return jnp.stack([t.x_e, t.T_b, t.kappa_dot])

    x = np.array([0.0224, 0.245])
    f = jax.jit(table)
    jac = np.asarray(jax.jit(jax.jacfwd(table))(x))
    lna = default_grid()
    keep = (lna > np.log(1 / 1501.0)) & (lna < np.log(1 / 11.0))
    for d in range(2):
        e = np.zeros(2)
        e[d] = 1e-4 * x[d]
        fd = np.asarray(f(x + e) - f(x - e)) / (2 * e[d])
        err = np.abs(jac[..., d] - fd)[:, keep].max(axis=1)
        scale = np.abs(fd)[:, keep].max(axis=1)
        assert np.all(err < 1e-5 * scale), (d, err / scale)


def test_radau_path_under_jit_then_jacfwd():
    """A jitted caller, called, then differentiated (``jax.jacfwd(jax.jit(f))``, as a sampler's
    likelihood does): the path's jvp rule runs after the caller's trace has ended, so it must
    not hold that trace's values (the grid built inside the caller)."""
    theta = jnp.array([0.04, 1e4, 0.3, 0.1])
    f = jax.jit(_linearised)
    np.testing.assert_allclose(np.asarray(f(theta)), np.asarray(_linearised(theta)),
                               rtol=1e-12, atol=0)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(f)(theta)),
                               np.asarray(jax.jacfwd(_linearised)(theta)), rtol=1e-10, atol=0)
