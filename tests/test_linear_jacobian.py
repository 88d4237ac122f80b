"""The Jacobian derived from the linear source (models.linear_jacobian) against jax.jacfwd.

The EB rhs is linear in y, so J is its coefficient matrix; the derived straight-line J must equal
the forward-mode Jacobian of the very same rhs to rounding, for every species combination, with
its structural pattern covering every nonzero.  A source that is not linear must be refused.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.linear_jacobian import NonlinearSource, derive_linear_jacobian
from test_cuda_backend import _eb_setup


def _dense(lj, values, n):
    out = np.zeros((n, n))
    out[np.asarray(lj.rows), np.asarray(lj.cols)] = np.asarray(values)
    return out


@pytest.fixture(scope="module")
def eb_massive():
    k = np.array([0.003, 0.2, 3.0])
    return _eb_setup(k)


def _check_against_jacfwd(model, table, params, xs):
    lj = model.linear_jacobian
    rng = np.random.default_rng(0)
    values = jax.jit(lambda x, p: jnp.stack(lj.values(x, p, table)))
    split = model.table_split
    core = jax.jit(lambda x, p: jnp.stack(lj.core(x, p, split.lookup(x, p, table))))
    jac = jax.jit(jax.jacfwd(lambda y, x, p: jnp.stack(model.rhs(y, x, p, table))))
    worst = 0.0
    for p in params:
        for x in xs:
            y = jnp.asarray(rng.normal(size=model.n))
            ref = np.asarray(jac(y, x, jnp.asarray(p)))
            got = _dense(lj, values(x, jnp.asarray(p)), model.n)
            got_core = _dense(lj, core(x, jnp.asarray(p)), model.n)
            # relative to each row's largest entry: rows mix terms of very different size
            scale = np.maximum(np.abs(ref).max(axis=1, keepdims=True), 1e-300)
            worst = max(worst, float(np.max(np.abs(got - ref) / scale)),
                        float(np.max(np.abs(got_core - ref) / scale)))
            # the structural pattern covers every numerical nonzero
            outside = np.ones((model.n, model.n), bool)
            outside[np.asarray(lj.rows), np.asarray(lj.cols)] = False
            assert not np.any(ref[outside] != 0.0)
    return worst


def test_derived_jacobian_equals_jacfwd_massive_neutrinos(eb_massive):
    model, table, params, x0, _, _ = eb_massive
    xs = [float(x0.min()), math.log(1e-3), math.log(0.5), 0.0]
    assert _check_against_jacfwd(model, jnp.asarray(table), params, xs) <= 1e-12


def test_derived_jacobian_equals_jacfwd_fluid_and_at_lambda(eb_massive):
    """The dark-energy variants use the same table; their extra parameters are set by hand."""
    from models.eb import build_eb_model

    model0, table, params, x0, _, _ = eb_massive
    for kw in (dict(de_fluid=True), dict(de_at_lambda=True)):
        model = build_eb_model(l_max_g=8, l_max_pol_g=6, l_max_ur=8, ncdm=model0.ncdm,
                               l_max_ncdm=6, **kw)
        extra = {"rho_de0": 2e-8, "w0": -0.9, "wa": 0.1, "cs2_de": 1.0}
        base = dict(zip(model0.param_names, params[0]))
        rows = np.array([model.make_params(**{**base, **{n: extra[n] for n in model.param_names
                                                        if n in extra}, "k": kk})
                         for kk in params[:, 0]])
        xs = [math.log(1e-4), math.log(0.3)]
        assert _check_against_jacfwd(model, jnp.asarray(table), rows, xs) <= 1e-12, kw


def test_nonlinear_sources_are_refused():
    for body, what in (("a = y[0] * y[1]", "product"), ("a = 1.0 / y[0]", "division"),
                       ("a = M.exp(y[0])", "inside"), ("a = y[0] ** 2", "operator"),
                       ("a = y", "as a whole")):
        src = f"def rhs(y, x, p):\n    {body}\n    return (a,)\n"
        with pytest.raises(NonlinearSource, match=what):
            derive_linear_jacobian(src, "rhs")


def test_affine_terms_and_intermediates():
    src = ("def rhs(y, x, p):\n"
           "    s = 2.0 * y[0] - y[1] / p[0]\n"
           "    t = p[1] + x\n"
           "    return (-s * t + 3.0, y[1], t)\n")
    lj = derive_linear_jacobian(src, "rhs")
    assert lj.entries == ((0, 0), (0, 1), (1, 1))
    scope = {}
    exec(lj.source, scope)
    got = scope["jacobian"](0.5, [4.0, 1.5])
    assert got == pytest.approx((-4.0, 0.5, 1.0), rel=1e-15)


@pytest.mark.slow  # two joint solves: 1.5-5 min on the 2-core CI machine; the gradient tests
# run the same joint plan against finite differences in the default suite
def test_joint_solve_with_declared_jacobian_matches_colour_sweeps(eb_massive):
    """Forward sensitivities of the EB model in parameters and tables: the joint plan built from
    the declared Jacobian (H_d as the directional derivative of J's entries) against the colour
    sweeps of the forward-over-forward joint rhs (the same rhs with the declaration hidden)."""
    from solver import joint_solve

    model, table, params, x0, y0, w = eb_massive
    inner = model.rhs

    def hidden(y, x, p, tab):
        return inner(y, x, p, tab)

    rng = np.random.default_rng(5)
    m = 2
    dparams = np.zeros((m,) + params.shape)
    dparams[0, :, 4:8] = params[:, 4:8] * rng.normal(size=4)      # the densities
    dtab = np.zeros((m,) + table.shape)
    dtab[1] = 1e-2 * table                                          # a smooth table direction
    xs = np.linspace(float(x0.max()), -2.0, 3)
    kw = dict(args=jnp.asarray(table), t0=x0, rtol=1e-5, atol=1e-9, error_weights=w,
              dparams=dparams, dargs=dtab)
    ys_a, dys_a, info_a = joint_solve(model.rhs, y0, xs, params, **kw)
    ys_b, dys_b, info_b = joint_solve(hidden, y0, xs, params, **kw)
    assert np.all(np.asarray(info_a["status"]) == 0) and np.all(np.asarray(info_b["status"]) == 0)
    steps_a, steps_b = np.asarray(info_a["n_accepted"]), np.asarray(info_b["n_accepted"])
    assert np.all(np.abs(steps_a - steps_b) <= 0.05 * steps_b + 2), (steps_a, steps_b)
    ctrl = w > 0
    for a, b in ((ys_a, ys_b), (dys_a, dys_b)):
        a, b = np.asarray(a)[..., ctrl], np.asarray(b)[..., ctrl]
        scale = np.abs(b).max(axis=-1, keepdims=True) + 1e-30
        assert np.max(np.abs(a - b) / scale) < 1e-4


def test_joint_dfdt_by_central_difference_matches_forward_mode(eb_massive):
    """The joint sensitivity plan takes ∂f/∂t of the joint rhs (the rhs and its tangents along
    parameter and table directions) by a central difference in t (``central_dfdt``) instead of
    forward mode over the tangents' forward mode. ∂f/∂t enters a Rosenbrock stage as h·∂f/∂t,
    so that is what must agree with forward mode: to 1e-7 of max |f| on the EB model at early,
    recombination-era and late times, for steps from 1e-7 to 0.3 in ln a (measured: 2e-8);
    the rhs itself comes back to rounding."""
    from solver.backends.jax.joint import central_dfdt

    model, table, params, x0, y0, w = eb_massive
    tab = jnp.asarray(table)
    rng = np.random.default_rng(11)
    dtab = jnp.asarray(1e-2 * table * rng.normal(size=table.shape[-1]))

    def joint(y, s, x, p, dp):
        def f(y_, p_, tab_):
            return jnp.stack(model.rhs(y_, x, p_, tab_))
        fy, ds = jax.jvp(f, (y, p, tab), (s, dp, dtab))
        return jnp.concatenate([fy, ds])

    @jax.jit
    def both(y, s, x, p, dp, h):
        value, by_difference = central_dfdt(lambda t: joint(y, s, t, p, dp), x, h)
        ref_value, by_forward_mode = jax.jvp(lambda t: joint(y, s, t, p, dp), (x,), (1.0,))
        return value, ref_value, by_difference, by_forward_mode

    worst = 0.0
    for p in params:
        for x in (-11.0, -6.9, -2.5):            # radiation era, recombination, late times
            for h in (1e-7, 1e-3, 0.3):
                y, s = rng.normal(size=(2, model.n))
                dp = np.zeros_like(p)
                dp[4:8] = p[4:8] * rng.normal(size=4)
                value, ref_value, got, ref = (np.asarray(a) for a in both(
                    jnp.asarray(y), jnp.asarray(s), x, jnp.asarray(p), jnp.asarray(dp), h))
                scale = np.max(np.abs(ref_value))
                assert np.max(np.abs(value - ref_value)) <= 1e-13 * scale
                worst = max(worst, h * float(np.max(np.abs(got - ref))) / scale)
    assert worst < 1e-7, worst
