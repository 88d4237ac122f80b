"""CUDA backend (issue 4) against the JAX backend, and its Enzyme Jacobian against jax.jacfwd.

GPU tests (``-m gpu``): run on the device machine.  The ``emulated`` tests run the very kernel
text the GPU compiles on the CPU (numpy local arrays, jax.jvp in place of Enzyme), so the kernel's
logic -- stage loop, controller, dense output, statuses, colour decompression, LU -- is checked in
CI too; they are quick (a few seconds).

Pass criteria: the CUDA backend's error against a scipy Radau (rtol 1e-12) reference, in units of
(rtol |y_ref| + atol), is at most max(10, 1.5 × the JAX backend's); CUDA and JAX within 20 of each
other (two solutions each within 10 tolerances of the truth; rounding differences move a few
accept/reject decisions, so the step sequences are not bit-identical); identical status codes.
"""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.stiff import HIRES, ROBERTSON, VAN_DER_POL, van_der_pol_lattice
from solver import solve
from solver.status import Status

LATTICE = van_der_pol_lattice(32)

CASES = {
    "robertson": (ROBERTSON, np.concatenate([[0.0], np.logspace(-4, 5, 10)]), 1e-6, 1e-12),
    "hires": (HIRES, np.linspace(0.0, 321.8122, 9), 1e-6, 1e-9),
    "van_der_pol": (VAN_DER_POL, np.linspace(0.0, 3000.0, 7), 1e-6, 1e-9),
    # t <= 3: past a few relaxation jumps the lattice amplifies local errors (tests/test_solver_stiff)
    "vdp_lattice": (LATTICE, np.linspace(0.0, 3.0, 4), 1e-6, 1e-9),
}


def blowup_rhs(y, t, p):
    """y0' = p0 y0^2 blows up at t = 1/(p0 y0(0)): STEP_TOO_SMALL for p0 = 10 on [0, 1]."""
    return (p[0] * y[0] * y[0], -y[1])


def _ensemble(prob, N, spread=0.2, seed=0):
    rng = np.random.default_rng(seed)
    scale = 1.0 + spread * (rng.random((N, prob.params.size)) - 0.5)
    params = prob.params[None, :] * scale
    y0 = np.tile(prob.y0, (N, 1))
    return y0, params


def _compare(a, b, rtol, atol, bound=10.0):
    assert np.asarray(a.status).tolist() == np.asarray(b.status).tolist(), \
        f"statuses differ: jax {np.asarray(a.status)} vs {b.backend} {np.asarray(b.status)}"
    ok = np.asarray(a.status) == Status.OK
    ya, yb = np.asarray(a.ys)[ok], np.asarray(b.ys)[ok]
    ratio = np.abs(ya - yb) / (rtol * np.abs(ya) + atol)
    assert np.all(np.isfinite(yb)), "non-finite values in a finished trajectory"
    assert ratio.max() <= bound, f"{b.backend} vs jax: max |diff|/tol = {ratio.max():.3g}"
    return ratio.max()


# ----------------------------------------------------------------------------- CPU: emulation
@pytest.mark.parametrize("name", ["robertson", "hires", "van_der_pol"])
def test_emulated_kernel_matches_jax(name):
    from solver.cuda_backend import solve_emulated

    prob, ts, rtol, atol = CASES[name]
    y0, params = _ensemble(prob, 3)
    a = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
    b = solve_emulated(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
    _compare(a, b, rtol, atol)
    # same algorithm step for step (rounding may shift a step count by a few at most)
    assert np.all(np.abs(np.asarray(a.n_accepted) - b.n_accepted) <= 3)


def test_emulated_kernel_small_lattice():
    from solver.cuda_backend import solve_emulated

    prob = van_der_pol_lattice(3)
    ts = np.linspace(0.0, 20.0, 5)
    y0, params = _ensemble(prob, 2)
    a = solve(prob.rhs, y0, ts, params, rtol=1e-6, atol=1e-9)
    b = solve_emulated(prob.rhs, y0, ts, params, rtol=1e-6, atol=1e-9)
    _compare(a, b, 1e-6, 1e-9)


@pytest.mark.parametrize("max_steps", [100_000, 30])
def test_emulated_kernel_failures(max_steps):
    from solver.cuda_backend import solve_emulated

    y0 = np.ones((3, 2))
    p = np.array([[0.1], [10.0], [0.5]])
    ts = np.linspace(0.0, 1.0, 5)
    a = solve(blowup_rhs, y0, ts, p, rtol=1e-6, atol=1e-9, max_steps=max_steps)
    b = solve_emulated(blowup_rhs, y0, ts, p, rtol=1e-6, atol=1e-9, max_steps=max_steps)
    _compare(a, b, 1e-6, 1e-9)
    assert b.status[1] != Status.OK and b.status[0] == b.status[2] == Status.OK
    assert np.all(np.isnan(b.ys[1, 1:]))


def test_cuda_import_is_lazy():
    """Importing the backend needs neither numba-cuda-mlir nor numba-enzyme-cuda."""
    import solver.cuda_backend as cb
    import solver.cuda_codegen  # noqa: F401

    if importlib.util.find_spec("numba_enzyme") is None or \
            importlib.util.find_spec("numba_cuda_mlir") is None:
        with pytest.raises(cb.CudaBackendUnavailable, match="numba"):
            solve(ROBERTSON.rhs, ROBERTSON.y0[None], [0.0, 1.0], ROBERTSON.params[None],
                  backend="cuda")


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_matches_jax(name):
    prob, ts, rtol, atol = CASES[name]
    N = 64 if name == "vdp_lattice" else 8
    y0, params = _ensemble(prob, N)
    a = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
    b = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol, backend="cuda")
    assert b.backend == "cuda"
    _compare(a, b, rtol, atol, bound=20.0)
    from scipy.integrate import solve_ivp
    for i in (0, N - 1):
        ref = solve_ivp(lambda t, y: np.array(prob.rhs(y, t, params[i])), (ts[0], ts[-1]), y0[i],
                        method="Radau", rtol=1e-12, atol=1e-16, t_eval=ts).y.T
        err = {sol.backend: (np.abs(np.asarray(sol.ys[i]) - ref) / (rtol * np.abs(ref) + atol)).max()
               for sol in (a, b)}
        # the CUDA backend is as accurate as the JAX backend (same algorithm); the JAX backend's
        # own accuracy contract is pinned by tests/test_solver_stiff.py
        assert err["cuda"] <= max(10.0, 1.5 * err["jax"]), f"member {i}: error/tol {err}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_enzyme_jacobian_equals_jacfwd(name):
    from solver.cuda_backend import build_plan

    prob = CASES[name][0]
    plan = build_plan(prob.rhs, prob.n, prob.params.size)
    rng = np.random.default_rng(1)
    N = 5
    y = prob.y0[None, :] + 0.3 * rng.standard_normal((N, prob.n))
    t = rng.random(N)
    params = np.tile(prob.params, (N, 1))
    f, jv, dfdt = plan.jacobian(y, t, params)
    for i in range(N):
        def fy(yy, tt, i=i):
            return jnp.stack([jnp.asarray(v, jnp.float64)
                              for v in prob.rhs(yy, tt, jnp.asarray(params[i]))])
        J = np.asarray(jax.jacfwd(fy)(jnp.asarray(y[i]), t[i]))
        dt = np.asarray(jax.jacfwd(fy, argnums=1)(jnp.asarray(y[i]), jnp.asarray(t[i])))
        f_ref = np.asarray(fy(jnp.asarray(y[i]), t[i]))
        in_pat = plan.pattern[plan.linear.slot_rows, plan.linear.slot_cols]
        J_slots = plan.linear.from_dense(J)
        scale = np.maximum(np.abs(J).max(), 1.0)
        np.testing.assert_allclose(jv[i][in_pat], J_slots[in_pat], rtol=1e-12, atol=1e-12 * scale)
        # nothing outside the pattern (the pattern is a superset of J's structure)
        assert np.all(J[~plan.pattern] == 0.0)
        np.testing.assert_allclose(dfdt[i], dt, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(f[i], f_ref, rtol=1e-12, atol=1e-14 * np.abs(f_ref).max())


@pytest.mark.gpu
@pytest.mark.parametrize("max_steps", [100_000, 30])
def test_cuda_failing_trajectory(max_steps):
    y0 = np.ones((3, 2))
    p = np.array([[0.1], [10.0], [0.5]])
    ts = np.linspace(0.0, 1.0, 5)
    a = solve(blowup_rhs, y0, ts, p, rtol=1e-6, atol=1e-9, max_steps=max_steps)
    b = solve(blowup_rhs, y0, ts, p, rtol=1e-6, atol=1e-9, max_steps=max_steps, backend="cuda")
    _compare(a, b, 1e-6, 1e-9)
    assert b.status[1] != Status.OK and b.status[0] == b.status[2] == Status.OK
    assert np.all(np.isnan(np.asarray(b.ys)[1, 1:]))


@pytest.mark.gpu
def test_cuda_max_steps_in_ensemble():
    """One stiff member runs out of steps; the others are right."""
    prob, ts, rtol, atol = CASES["van_der_pol"]
    params = np.array([[1e3], [10.0], [1e3], [1e3]])  # mu = 10 needs ~2000 steps on [0, 3000]
    y0 = np.tile(prob.y0, (4, 1))
    a = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol, max_steps=1500)
    b = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol, max_steps=1500, backend="cuda")
    _compare(a, b, rtol, atol)
    assert b.status.tolist() == [Status.OK, Status.MAX_STEPS, Status.OK, Status.OK]
