"""The warp kernel on a GPU (``-m gpu``): against the JAX backend, its own CPU emulation and the
thread kernel, through both launches, and its Jacobian kernel against ``jax.jacfwd``.

The EB model of tests/test_cuda_backend.py (n = 50, analytic thermodynamics) keeps the compile
short; the pipeline tests of that file run the default model through the warp kernel (the
backend's default for it).
"""
import numpy as np
import pytest

from solver import CudaBackend, Status, solve
from test_cuda_backend import EB_ATOL, EB_RTOL, _eb_setup, check_eb_jacobian

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def case():
    k = np.array([0.002, 0.02, 0.1, 0.3, 0.7])
    model, table, params, x0, y0, w = _eb_setup(k)
    xs = np.linspace(x0.max(), -0.5, 6)
    kw = dict(args=table, t0=x0, rtol=EB_RTOL, atol=EB_ATOL, error_weights=w)
    return model, table, params, x0, y0, w, xs, kw


def _rel(a, b, w):
    ctrl = w > 0
    ya, yb = np.asarray(a.ys)[..., ctrl], np.asarray(b.ys)[..., ctrl]
    return (np.abs(yb - ya) / np.maximum(np.abs(ya), EB_ATOL / EB_RTOL)).max()


def test_warp_kernel_matches_jax_and_emulation(case):
    model, table, params, x0, y0, w, xs, kw = case
    ref = solve(model.rhs, y0, xs, params, **kw)
    gpu = solve(model.rhs, y0, xs, params, backend=CudaBackend(launch="ffi"), **kw)
    assert gpu.info["kernel"] == "warp" and gpu.info["lanes"] == 32
    assert np.all(gpu.status == Status.OK), (gpu.status, gpu.t_final, gpu.n_accepted,
                                             gpu.n_rejected)
    assert _rel(ref, gpu, w) <= 10 * EB_RTOL
    # the GPU's contracted arithmetic changes a few accept/reject decisions (the thread kernel
    # shows the same 2-6 % fewer steps than the JAX backend; docs/benchmarks.md)
    ref_steps = np.asarray(ref.n_accepted)
    assert np.all(np.abs(ref_steps - gpu.n_accepted) <= np.maximum(3, 0.06 * ref_steps))
    emu = solve(model.rhs, y0, xs, params, backend=CudaBackend(launch="emulated"), **kw)
    assert _rel(emu, gpu, w) <= 10 * EB_RTOL
    numba = solve(model.rhs, y0, xs, params, backend=CudaBackend(launch="numba"), **kw)
    np.testing.assert_array_equal(numba.ys, np.asarray(gpu.ys))
    np.testing.assert_array_equal(numba.n_accepted, gpu.n_accepted)


def test_warp_kernel_matches_thread_kernel(case):
    model, table, params, x0, y0, w, xs, kw = case
    gpu = solve(model.rhs, y0, xs, params, backend=CudaBackend(launch="ffi"), **kw)
    thread = solve(model.rhs, y0, xs, params, backend=CudaBackend(launch="ffi", kernel="thread"),
                   **kw)
    assert thread.info["kernel"] == "thread"
    assert _rel(thread, gpu, w) <= 10 * EB_RTOL


def test_warp_kernel_failures_per_trajectory(case):
    model, table, params, x0, y0, w, xs, kw = case
    ref = solve(model.rhs, y0, xs, params, max_steps=60, **kw)
    gpu = solve(model.rhs, y0, xs, params, max_steps=60, backend=CudaBackend(launch="ffi"), **kw)
    np.testing.assert_array_equal(gpu.status, np.asarray(ref.status))
    assert np.any(gpu.status == Status.MAX_STEPS)
    np.testing.assert_array_equal(np.isnan(np.asarray(gpu.ys)), np.isnan(np.asarray(ref.ys)))


def test_warp_jacobian_kernel_equals_jacfwd(case):
    from solver.backends.cuda.warp_plan import build_warp_plan

    model, table, params, x0, y0, w, xs, kw = case
    rng = np.random.default_rng(3)
    pts = np.concatenate([x0, np.linspace(-14.0, -0.4, len(x0))])
    P = np.concatenate([params, params])
    y = np.concatenate([y0, y0 * (1.0 + 0.3 * rng.standard_normal(y0.shape))])
    plan = build_warp_plan(model.rhs, model.n, params.shape[1], args=table)
    f, jv, dfdt = plan.jacobian(y, pts, P, table)
    check_eb_jacobian(model, table, y, pts, P, f, jv, dfdt, plan)


def test_warp_sensitivities_match_jax(case):
    """The warp sensitivity kernel (numba launch) along a direction with a tangent table, a
    parameter and an initial tangent: against jax.jvp of the JAX backend's solve_diff, to 10 rtol
    of the tangent's scale on the controlled components."""
    import jax
    import jax.numpy as jnp

    from solver import solve_diff
    from solver.backends.cuda.launch_numba import solve_sensitivities
    from test_cuda_sensitivity import _eb_direction

    model, table, params, x0, y0, w, xs, kw = case
    dtab, dp, dy0 = _eb_direction(model, table, params, y0)
    opts = dict(t0=x0, rtol=EB_RTOL, atol=EB_ATOL, error_weights=w)
    _, ref = jax.jvp(lambda tab, q, y: solve_diff(model.rhs, y, xs, q, args=tab, **opts),
                     (jnp.asarray(table), jnp.asarray(params), jnp.asarray(y0)),
                     (jnp.asarray(dtab), jnp.asarray(dp), jnp.asarray(dy0)))
    r = solve_sensitivities(model.rhs, y0, xs, params, s0=dy0[None], dparams=dp[None],
                            dargs=dtab[None], args=table, **opts)
    assert r.info["kernel"] == "warp"
    assert np.all(r.status == Status.OK), r.status
    ctrl = w > 0
    ref = np.asarray(ref)[..., ctrl]
    err = np.abs(r.dys[0][..., ctrl] - ref).max() / np.abs(ref).max()
    assert err <= 10 * EB_RTOL, err
