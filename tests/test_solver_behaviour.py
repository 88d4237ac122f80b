"""Solver behaviour beyond accuracy: convergence order, failure reporting, input validation."""
import numpy as np
import pytest

from stiff_problems import ROBERTSON
from solver import PIDController, Status, solve
from solver import RODAS5P


def _oscillator(y, t, p):
    # smooth nonlinear problem with a closed-form-free but cheap solution
    return (y[1], -p[0] * y[0] - 0.1 * y[0] * y[0] * y[0], -0.5 * y[2] + y[0] * y[1])


def test_tableau_order_conditions():
    """Rodas5P's structure: stiffly accurate tail, last stages at t + h, no ∂f/∂t there."""
    tab = RODAS5P
    assert tab.stages == 8
    np.testing.assert_array_equal(tab.c[5:], 1.0)
    np.testing.assert_array_equal(tab.d[5:], 0.0)
    assert np.triu(tab.a).sum() == 0 and np.triu(tab.C).sum() == 0
    # stiffly accurate: the propagated solution is the last stage argument plus the last increment
    np.testing.assert_allclose(tab.b[:-1], tab.a[-1, :-1], atol=0)


def test_global_order_five_with_fixed_steps():
    """Halving a fixed step divides the global error by ~2^5 (embedded control disabled)."""
    p = np.array([[4.0]])
    y0 = np.array([[1.0, 0.0, 0.2]])
    T = 2.0
    ref = solve(_oscillator, y0, [0.0, T], p, rtol=1e-13, atol=1e-15)
    errs = []
    steps = [T / 10, T / 20, T / 40]
    loose = PIDController(factor_min=0.999999, factor_max=1.000001, safety=1.0)
    for h in steps:
        sol = solve(_oscillator, y0, [0.0, T], p, rtol=0.9, atol=1e3, first_step=h,
                    controller=loose)
        assert sol.status[0] == Status.OK
        assert abs(int(sol.n_accepted[0]) - round(T / h)) <= 1
        errs.append(np.abs(np.asarray(sol.ys[0, -1]) - np.asarray(ref.ys[0, -1])).max())
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(np.abs(orders - 5.0) < 0.5), f"measured orders {orders}, errors {errs}"


def test_error_falls_with_tolerance():
    """Tolerance proportionality: tighter rtol, proportionally smaller error (within a factor)."""
    p = np.array([[4.0]])
    y0 = np.array([[1.0, 0.0, 0.2]])
    ts = np.linspace(0.0, 5.0, 6)
    ref = np.asarray(solve(_oscillator, y0, ts, p, rtol=1e-13, atol=1e-15).ys[0])
    errs = []
    for rtol in (1e-4, 1e-6, 1e-8):
        ys = np.asarray(solve(_oscillator, y0, ts, p, rtol=rtol, atol=rtol).ys[0])
        errs.append(np.abs(ys - ref).max())
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 1e-7


def _blowup(y, t, p):
    return (p[0] * y[0] * y[0], -y[1])


def test_failing_trajectory_is_reported_and_others_are_right():
    """y' = c y² blows up at t = 1/(c y0) for c > 0; the others must be unaffected."""
    params = np.array([[-1.0], [2.0], [-0.5]])  # middle one blows up at t = 0.5
    y0 = np.ones((3, 2))
    ts = np.array([0.0, 0.25, 1.0])
    sol = solve(_blowup, y0, ts, params, rtol=1e-8, atol=1e-10, max_steps=2000)
    assert sol.status[0] == Status.OK and sol.status[2] == Status.OK
    assert sol.status[1] in (Status.STEP_TOO_SMALL, Status.NON_FINITE, Status.MAX_STEPS)
    ys = np.asarray(sol.ys)
    # exact: y = 1/(1 - c t)
    for i, c in ((0, -1.0), (2, -0.5)):
        np.testing.assert_allclose(ys[i, :, 0], 1.0 / (1.0 - c * ts), rtol=1e-7)
    assert np.isnan(ys[1, -1]).all(), "a failed trajectory must not return values it never reached"
    np.testing.assert_allclose(ys[1, 1, 0], 1.0 / (1.0 - 0.5), rtol=1e-7)
    assert sol.failures()[0][0] == 1
    assert sol.stats()["failed"] == 1


def test_max_steps_status():
    sol = solve(ROBERTSON.rhs, ROBERTSON.y0[None], [0.0, 1e5], ROBERTSON.params[None],
                rtol=1e-8, atol=1e-14, max_steps=20)
    assert sol.status[0] == Status.MAX_STEPS
    assert sol.failures() == [(0, "max_steps")]


def test_error_weights_zero_removes_component_from_control():
    """A fast oscillation excluded from error control no longer dictates the step count."""
    def rhs(y, t, p):
        return (-y[0], p[0] * y[2], -p[0] * y[1])  # y1,y2: fast rotation, decoupled from y0

    y0 = np.array([[1.0, 1.0, 0.0]])
    p = np.array([[1e3]])
    full = solve(rhs, y0, [0.0, 5.0], p, rtol=1e-6, atol=1e-9)
    slow = solve(rhs, y0, [0.0, 5.0], p, rtol=1e-6, atol=1e-9, error_weights=[1.0, 0.0, 0.0])
    assert slow.n_accepted[0] * 10 < full.n_accepted[0]
    np.testing.assert_allclose(np.asarray(slow.ys[0, -1, 0]), np.exp(-5.0), rtol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(y0=np.ones(3)), "shape \\(N, n\\)"),
    (dict(y0=np.array([[1.0, np.nan, 0.0]])), "non-finite"),
    (dict(params=np.ones((2, 3))), "params must have shape"),
    (dict(t_save=[1.0, 0.5]), "ascending"),
    (dict(rtol=2.0), "rtol"),
    (dict(atol=-1.0), "atol"),
    (dict(error_weights=[1.0, 1.0]), "error_weights"),
    (dict(backend="opencl"), "backend"),
    (dict(t_save=[0.0, 1.0], t_end=0.5), "within"),
    (dict(max_steps=0), "max_steps"),
])
def test_bad_input_raises_clear_error(kwargs, match):
    args = dict(y0=ROBERTSON.y0[None], t_save=[0.0, 1.0], params=ROBERTSON.params[None])
    args.update({k: v for k, v in kwargs.items() if k in args})
    opts = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(ValueError, match=match):
        solve(ROBERTSON.rhs, args["y0"], args["t_save"], args["params"], **opts)


def test_float64_is_required_not_imposed():
    """Importing solver leaves JAX's configuration alone; solving with 64-bit mode off is an
    error that names the fix (conftest.py turns it on for the suite)."""
    import jax

    from solver import joint_solve, solve_diff

    jax.config.update("jax_enable_x64", False)
    try:
        for fn in (solve, solve_diff):
            with pytest.raises(RuntimeError, match="jax_enable_x64"):
                fn(ROBERTSON.rhs, ROBERTSON.y0[None], [0.0, 1.0], ROBERTSON.params[None])
        with pytest.raises(RuntimeError, match="jax_enable_x64"):
            joint_solve(ROBERTSON.rhs, ROBERTSON.y0[None], [0.0, 1.0], ROBERTSON.params[None],
                        dy0=np.ones((1, 1, 3)))
    finally:
        jax.config.update("jax_enable_x64", True)


def test_caches_are_bounded_and_cleared_in_one_place():
    from solver import Cache, clear_caches
    from solver.caches import registered_caches

    cache = Cache("test.lru", maxsize=2)
    builds = []
    for key in ("a", "b", "a", "c"):                    # "b" is the least recently used
        cache.get_or_build(key, lambda key=key: builds.append(key) or key.upper())
    assert builds == ["a", "b", "c"] and "b" not in cache and len(cache) == 2
    assert cache.get("a") == "A" and cache.get("b", "-") == "-"
    assert cache in registered_caches()
    solve(ROBERTSON.rhs, ROBERTSON.y0[None], [0.0, 1.0], ROBERTSON.params[None])
    plans = [c for c in registered_caches() if c.name == "jax.plans"]
    assert plans and len(plans[0]) > 0
    clear_caches(jax_caches=False)
    assert len(cache) == 0 and len(plans[0]) == 0
    with pytest.raises(ValueError, match="maxsize"):
        Cache("test.bad", maxsize=0)
