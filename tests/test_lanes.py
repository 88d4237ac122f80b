"""The JAX backend's lanes (``JaxBackend(lanes=L)``): L trajectories advance together and a lane
whose trajectory has finished takes the next waiting one. Every trajectory must come out as in
lock-step — values, status, counters and final time — whatever L, including trajectories that
start finished and ones that fail."""
import jax
import numpy as np
import pytest

from stiff_problems import van_der_pol_rhs
from solver import JaxBackend, Status, solve
from solver.backends.jax.ensemble import lane_count


def _ensemble():
    """van der Pol with μ from 1 to 40 (step counts from tens to hundreds), end times spread,
    one trajectory ending where it starts and one that runs out of steps."""
    N = 11
    mu = np.geomspace(1.0, 40.0, N)[:, None]
    t_end = np.linspace(5.0, 60.0, N)
    t_end[2] = 0.0                          # finished at the start
    mu[7], t_end[7] = 1.0, 5000.0           # hundreds of oscillations: runs out of steps
    ts = np.stack([np.linspace(0.0, te, 4) for te in t_end])
    return np.tile([2.0, 0.0], (N, 1)), ts, mu, t_end


def _solve(lanes):
    y0, ts, mu, t_end = _ensemble()
    return solve(van_der_pol_rhs, y0, ts, mu, t_end=t_end, rtol=1e-6, atol=1e-9,
                 backend=JaxBackend(lanes=lanes), max_steps=400)


@pytest.fixture(scope="module")
def lock_step():
    return _solve(None)


@pytest.mark.parametrize("lanes", [3, 11])
def test_lanes_reproduce_lock_step(lock_step, lanes):
    sol = _solve(lanes)
    status = np.asarray(lock_step.status)
    assert status[2] == Status.OK and status[7] == Status.MAX_STEPS   # the cases are present
    assert np.ptp(np.asarray(lock_step.n_accepted)) > 100             # and the spread
    np.testing.assert_array_equal(np.asarray(sol.status), status)
    np.testing.assert_array_equal(np.asarray(sol.n_accepted), np.asarray(lock_step.n_accepted))
    np.testing.assert_array_equal(np.asarray(sol.n_rejected), np.asarray(lock_step.n_rejected))
    np.testing.assert_allclose(np.asarray(sol.t_final), np.asarray(lock_step.t_final),
                               rtol=0, atol=0)
    np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(lock_step.ys), rtol=1e-13,
                               atol=1e-13, equal_nan=True)


def _eqns(jaxpr):
    """Every equation of a jaxpr, nested ones (jit, cond, while bodies) included."""
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else [v]):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    yield from _eqns(getattr(inner, "jaxpr", inner))


def test_lanes_bound_the_trajectories_in_the_loop():
    """The integration loop carries L trajectories, not N (else lanes would change nothing)."""
    from solver.backends.jax.plan import get_plan
    from solver import PIDController, RODAS5P

    y0, ts, mu, t_end = _ensemble()
    N, L = y0.shape[0], 3
    plan = get_plan(van_der_pol_rhs, 2, 1, False, None, None, "auto", RODAS5P,
                    PIDController(), 400, lanes=L)
    jaxpr = jax.make_jaxpr(plan.run)(y0, np.zeros(N), t_end, ts, mu, None, 1e-6,
                                     np.full(2, 1e-9), np.ones(2), np.full(N, np.nan))
    loops = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "while"]
    assert loops
    carried = [v.aval.shape for e in loops for v in e.outvars]
    assert (L, 2) in carried            # lock-step would carry only (N, 2)


def test_lane_count_and_bad_lanes():
    assert lane_count(10, None) == 10 and lane_count(10, 32) == 10 and lane_count(10, 4) == 4
    assert lane_count(101, "auto") == 32 and lane_count(1000, "auto") == 250
    assert lane_count(20, "auto") == 20 and lane_count(63, "auto") == 63
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="lanes must be a positive integer"):
            JaxBackend(lanes=bad)


def test_joint_sensitivity_solve_on_lanes_reproduces_lock_step():
    """``solve_with_tangents`` (the joint [y, s] loop) on lanes: the same values and tangents."""
    from solver import solve_with_tangents

    y0, ts, mu, t_end = _ensemble()
    keep = np.arange(y0.shape[0]) != 7          # the failing one makes NaN tangents
    y0, ts, mu, t_end = y0[keep], ts[keep], mu[keep], t_end[keep]
    dmu = np.stack([np.ones_like(mu)])          # one direction: ∂/∂μ
    out = {}
    for lanes in (None, 3):
        out[lanes] = solve_with_tangents(van_der_pol_rhs, y0, ts, mu, dparams=dmu,
                                         t_end=t_end, rtol=1e-6, atol=1e-9,
                                         backend=JaxBackend(lanes=lanes), max_steps=2000)
    for a, b in zip(out[None], out[3]):
        assert np.all(np.isfinite(np.asarray(a)))
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-12)
