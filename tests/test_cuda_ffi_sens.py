"""The sensitivity kernel's XLA FFI custom call (solver/backends/cuda/launch_ffi_sens.py) on the
CPU: the handler's packing twin shows, through a real ``jax.ffi.ffi_call``, the arguments in
SENS_KERNEL_ARGS / WARP_SENS_KERNEL_ARGS order with the padded directions; the grid is the host
launch's; the kernel is compiled for the host launch's argument types (one kernel-cache entry
serves both); failures become NaN as ``SensitivitySolution`` makes them; the host launch's checks
run on concrete operands and, from inside a compiled program, through a callback.

The GPU side (values against the host launch, the C_ℓ and P(k) Jacobians) is in
tests/test_cuda_sensitivity.py under ``-m gpu``.
"""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solver import RODAS5P, CudaBackend, PIDController, Status
from solver.backends.cuda.codegen import SENS_KERNEL_ARGS
from solver.backends.cuda.codegen.warp import WARP_SENS_KERNEL_ARGS
from solver.backends.cuda.inputs import pad_directions, sens_call_args, sens_inputs, sens_outputs
from solver.backends.cuda.ffi_kernel import expected_param_count
from solver.backends.cuda.kernel_cache import arg_types
from solver.backends.cuda.launch_cubin import parameter_count
from solver.backends.cuda.launch_ffi_sens import (SensFfiConfig, _check, _nan_where_unreached,
                                                  sensitivities_jax)
from solver.backends.cuda.results import SensitivitySolution
from solver.problem import SensitivitySpec
from stiff_problems import ROBERTSON
from test_cuda_backend import EB_ATOL, EB_RTOL, _eb_setup
from test_cuda_ffi import _bits, check_slots
from test_cuda_sensitivity import _eb_direction

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="g++ not found: the XLA FFI handler cannot be built here")

BACKEND = CudaBackend(launch="ffi", sensitivity_launch="ffi")


def _spec(rhs, n, P, table, rtol, atol, weights, sec=0.1, sens_atol=None):
    leaves, treedef = jax.tree_util.tree_flatten(table)
    meta = tuple((tuple(np.shape(x)), np.dtype(np.float64)) for x in leaves)
    atol_a = np.broadcast_to(np.asarray(atol, np.float64), (n,)).copy()
    sa = atol_a if sens_atol is None else np.broadcast_to(sens_atol, (n,)).copy()
    return SensitivitySpec(rhs, n, P, table is not None, treedef, meta, rtol, atol_a,
                           np.asarray(weights, np.float64), sa, sec, 1000, None, "auto", RODAS5P,
                           PIDController(), None, "exact", BACKEND)


@pytest.fixture(scope="module")
def eb_small():
    k = np.array([0.005, 0.05, 0.3])
    return (k,) + _eb_setup(k)


def _eb_case(eb_small, m):
    k, model, table, params, x0, y0, w = eb_small
    xs = np.linspace(x0.max(), -9.0, 3)
    dtab, dp, dy0 = _eb_direction(model, table, params, y0)
    scale = 1.0 + np.arange(m)[:, None, None]
    s0, dparams = scale * dy0[None], scale * dp[None]
    dtable = (1.0 + np.arange(m)).reshape((m,) + (1,) * table.ndim) * dtab[None]
    spec = _spec(model.rhs, model.n, params.shape[1], table, EB_RTOL, EB_ATOL, w)
    return model, table, params, x0, y0, xs, s0, dparams, dtable, spec


def _dump(spec, y0, params, table, xs, x0, s0, dparams, dtable, **kw):
    N = y0.shape[0]
    ts = np.broadcast_to(xs, (N, xs.size))
    te = np.full(N, xs[-1])
    _, dump = sensitivities_jax(BACKEND.ffi, spec, jnp.asarray(y0), jnp.asarray(params),
                                jnp.asarray(table), jnp.asarray(ts), jnp.asarray(x0),
                                jnp.asarray(te), jnp.asarray(s0), jnp.asarray(dparams),
                                None if dtable is None else jnp.asarray(dtable), probe=True, **kw)
    return np.asarray(dump)[0]


@needs_gxx
def test_thread_kernel_arguments_are_packed_in_order():
    """Robertson (no tables, the thread kernel): every SENS_KERNEL_ARGS entry, P = 3 padded to
    nothing, the dummy table and its single zero tangent table, n_dir = m."""
    N, m, n = 3, 2, 3
    y0 = np.tile(ROBERTSON.y0, (N, 1))
    params = np.tile(ROBERTSON.params, (N, 1))
    xs = np.array([0.0, 1.0, 10.0, 100.0])
    spec = _spec(ROBERTSON.rhs, n, 3, None, 1e-5, 1e-12, np.array([1.0, 0.0, 1.0]), sec=0.5)
    s0 = np.zeros((m, N, n))
    dparams = np.ones((m, N, 3))
    dump = _dump(spec, y0, params, np.zeros(1), xs, np.zeros(N), s0, dparams, None)
    shapes = {"y0": (N, n), "t0": (N,), "t_end": (N,), "t_save": (N, 4), "params": (N, 3),
              "args": (1,), "s0": (m, N, n), "dparams": (m, N, 3), "dargs": (1, 1),
              "atol": (n,), "atol_s": (n,), "weights": (1, n), "weights_s": (1, n), "h0": (N,),
              "ys": (N, 4, n), "dys": (m, N, 4, n), "t_out": (m, N), "status": (m, N),
              "n_accepted": (m, N), "n_rejected": (m, N)}
    scalars = {"rtol": _bits(1e-5), "n_weighted": _bits(2.0), "n_traj": N, "n_dir": m}
    check_slots(dump, SENS_KERNEL_ARGS, shapes, scalars)


@needs_gxx
def test_warp_kernel_arguments_are_packed_with_padded_directions(eb_small):
    """The EB model (the warp kernel): three directions at most two warps a block pad to four
    (zero directions), the tangent tables one per direction, the lane tables last."""
    model, table, params, x0, y0, xs, s0, dparams, dtable, spec = _eb_case(eb_small, 3)
    N, n, P = y0.shape[0], model.n, params.shape[1]
    dump = _dump(spec, y0, params, table, xs, x0, s0, dparams, dtable, dir_warps=2)
    cfg = SensFfiConfig(BACKEND.ffi, spec, table.shape, "auto", 2, probe=True)
    assert cfg.warp and cfg.direction_warps(3) == 2
    mp = 4
    shapes = {"y0": (N, n), "t0": (N,), "t_end": (N,), "t_save": (N, 3), "params": (N, P),
              "args": table.shape, "s0": (mp, N, n), "dparams": (mp, N, P),
              "dargs": (mp,) + table.shape, "atol": (n,), "atol_s": (n,), "weights": (1, n),
              "weights_s": (1, n), "h0": (N,), "ys": (N, 3, n), "dys": (mp, N, 3, n),
              "t_out": (mp, N), "status": (mp, N), "n_accepted": (mp, N), "n_rejected": (mp, N),
              "sched": cfg.plan.sched.shape, "sched_f": cfg.plan.sched_f.shape}
    n_w = float(np.sum(spec.weights > 0))
    scalars = {"rtol": _bits(EB_RTOL), "n_weighted": _bits(n_w), "n_traj": N, "n_dir": mp}
    check_slots(dump, WARP_SENS_KERNEL_ARGS, shapes, scalars)


def test_info_names_the_launch_and_the_kernels_registration(eb_small):
    """``last_sensitivity_info`` of a custom-call launch: the launch and the registered kernel
    (here the probe's stand-in: nothing compiled, no cache)."""
    model, table, params, x0, y0, xs, s0, dparams, dtable, spec = _eb_case(eb_small, 2)
    info = SensFfiConfig(BACKEND.ffi, spec, table.shape, "auto", None, probe=True).info()
    assert info["launch"] == "xla-ffi" and info["kernel"] == "warp"
    assert {"kernel_cache", "kernel_from_cache", "compile_seconds", "kernel_entry"} <= set(info)


def test_grid_is_the_host_launchs(eb_small):
    """The handler launches ceil(N · lanes / threads_per_block) blocks: a block per
    (trajectory, group of nw directions) of nw warps for the warp kernel, a thread per
    (trajectory, direction) for the thread kernel -- the host launch's grid."""
    from solver.backends.cuda.toolchain import THREADS_PER_BLOCK

    model, table, params, x0, y0, xs, s0, dparams, dtable, spec = _eb_case(eb_small, 3)
    N = 5
    for kind, most in (("auto", None), ("auto", 2), ("auto", 1), ("thread", None)):
        cfg = SensFfiConfig(BACKEND.ffi, spec, table.shape, kind, most, probe=True)
        for m in (1, 3, 7, 10):
            nw = cfg.direction_warps(m)
            mp = -(-m // nw) * nw
            tpb, lanes = cfg.grid(mp, nw)
            blocks = -(-N * lanes // tpb)
            if cfg.warp:
                assert (blocks, tpb) == (N * (mp // nw), cfg.plan.threads_per_block * nw)
            else:
                assert (blocks, tpb) == (-(-N * m // THREADS_PER_BLOCK), THREADS_PER_BLOCK)


@pytest.mark.parametrize("kind", ["warp", "thread"])
def test_kernel_is_compiled_for_the_host_launchs_argument_types(eb_small, kind):
    """The custom call compiles (or loads) the sensitivity kernel for exactly the argument
    types of the host launch (launch_numba.solve_sensitivities), so the kernel-cache key -- and
    the cubin -- is one for both launches."""
    model, table, params, x0, y0, xs, s0, dparams, dtable, spec = _eb_case(eb_small, 3)
    cfg = SensFfiConfig(BACKEND.ffi, spec, table.shape, kind, None)
    inp = sens_inputs(model.rhs, y0, np.broadcast_to(xs, (y0.shape[0], xs.size)), params, s0,
                      dparams, dtable, table, spec.rtol, spec.atol, spec.sens_atol, spec.sec, x0,
                      None, spec.weights, spec.max_steps, None)
    if cfg.warp:
        inp = pad_directions(inp, cfg.direction_warps(3))
    host = list(sens_call_args(inp, np.ascontiguousarray(table, np.float64),
                               sens_outputs(inp, fill=False)))
    i = SENS_KERNEL_ARGS.index("n_traj")
    host[i], host[i + 1] = np.int64(inp["N"]), np.int64(inp["m"])
    if cfg.warp:
        host += [cfg.plan.sched, cfg.plan.sched_f]
    assert arg_types(cfg.kernel_args, cfg.example()) == arg_types(cfg.kernel_args, host)
    # the layout packs as many parameters as the host launch (launch_cubin) passes
    assert expected_param_count(cfg.codes, cfg.in_ranks, cfg.out_ranks) == \
        parameter_count(host)


def test_failed_directions_make_nan_as_the_host_launch_does():
    rng = np.random.default_rng(3)
    m, N, ns, n = 3, 4, 5, 2
    dys = rng.normal(size=(m, N, ns, n))
    ys = rng.normal(size=(N, ns, n))
    status = np.full((m, N), int(Status.OK), np.int32)
    status[1, 2] = int(Status.MAX_STEPS)
    dys[1, 2, 3:] = np.nan           # the failed thread stopped after save time 2
    dys[0, 0, 1, 0] = np.nan         # a NaN in a finished trajectory is left as it is
    host = SensitivitySolution(ys, dys, status, None, None, None, "cuda", {})
    got_ys, got_dys = _nan_where_unreached(jnp.asarray(ys), jnp.asarray(dys), jnp.asarray(status))
    np.testing.assert_array_equal(np.asarray(got_dys), host.dys_or_nan())
    np.testing.assert_array_equal(np.asarray(got_ys), host.ys_or_nan())
    assert np.isnan(np.asarray(got_dys)[:, 2, 3:]).all()
    assert np.isnan(np.asarray(got_ys)[2, 3:]).all()


def test_lookup_columns_are_refused_eagerly_and_inside_a_program(eb_small):
    """The host launch refuses a nonzero tangent in a parameter column the table lookup reads;
    here too, on concrete operands and from inside a compiled program (the first run checks
    everything, later programs only those columns)."""
    model, table, params, x0, y0, xs, s0, dparams, dtable, spec = _eb_case(eb_small, 2)
    cfg = SensFfiConfig(BACKEND.ffi, spec, table.shape, "auto", None)
    ops = [jnp.asarray(a) for a in (y0, x0, params, table)]
    _check(cfg, *ops, jnp.asarray(dparams))               # concrete: checked now
    cols = cfg.plan.lookup_p
    assert cfg.plan.plain.split_checked and cols, cols
    bad = np.array(dparams)
    bad[1, 0, cols[0]] = 1.0
    with pytest.raises(NotImplementedError, match="table lookup depends on params columns"):
        _check(cfg, *ops, jnp.asarray(bad))

    def program(d):
        _check(cfg, *ops, d)
        return jnp.sum(d)

    run = jax.jit(program)
    assert float(run(jnp.asarray(dparams))) == pytest.approx(float(np.sum(dparams)))
    with pytest.raises(Exception, match="table lookup depends on params columns"):
        jax.block_until_ready(run(jnp.asarray(bad)))
    # a plan never checked: the program carries the whole check (table and first trajectory)
    cfg.plan.plain.split_checked, cfg.plan.lookup_p = False, None
    run = jax.jit(lambda d: program(d))    # a new function: traced again
    assert float(run(jnp.asarray(dparams))) == pytest.approx(float(np.sum(dparams)))
    assert cfg.plan.plain.split_checked and cfg.plan.lookup_p == cols


def test_settings_select_the_launch(monkeypatch):
    from boltzmann import runtime

    assert runtime.Settings.from_environment({}).cuda_sensitivity_launch == "auto"
    assert CudaBackend().sensitivity_launch == "auto"
    for launch in ("host", "ffi"):
        s = runtime.Settings.from_environment({"BOLTZMANN_CUDA_SENS_LAUNCH": launch})
        assert s.cuda_sensitivity_launch == launch
        assert runtime.backend_for("cuda", s).sensitivity_launch == launch
    # "auto" follows the plain solve's launch: the custom call with the FFI launch, the host
    # callback where there is none (the emulator, numba's launch)
    assert not CudaBackend(launch="emulated").sensitivity_via_ffi()
    assert not CudaBackend(launch="numba").sensitivity_via_ffi()
    auto = CudaBackend()
    monkeypatch.setattr(auto, "use_ffi", lambda: True)
    # JAX on the host (this machine; the kernel helper's process): the callback
    assert auto.sensitivity_via_ffi() == (jax.default_backend() == "gpu")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert auto.sensitivity_via_ffi()
    monkeypatch.setattr(auto, "use_ffi", lambda: False)
    assert not auto.sensitivity_via_ffi()
    assert not CudaBackend(sensitivity_launch="host").sensitivity_via_ffi()
    assert CudaBackend(sensitivity_launch="ffi").sensitivity_via_ffi()
    with pytest.raises(ValueError, match="BOLTZMANN_CUDA_SENS_LAUNCH"):
        runtime.Settings.from_environment({"BOLTZMANN_CUDA_SENS_LAUNCH": "gpu"})
    with pytest.raises(ValueError, match="sensitivity_launch"):
        CudaBackend(sensitivity_launch="device")
    with pytest.raises(ValueError, match="needs the XLA FFI launch"):
        CudaBackend(launch="emulated", sensitivity_launch="ffi")


# ----------------------------------------------------------------------------- GPU
def _with_tangents(backend, saved=None):
    from solver import solve_with_tangents

    y0, ts = jnp.asarray(ROBERTSON.y0)[None], jnp.array([0.0, 1e-2, 1.0, 1e2, 1e4])

    def run(q):
        dp = jnp.eye(3)[:, None, :] * q
        return solve_with_tangents(ROBERTSON.rhs, y0, ts, q, dparams=dp, rtol=1e-8, atol=1e-14,
                                   backend=backend, saved_states=saved)
    return run


@pytest.mark.gpu
def test_ffi_sensitivities_equal_the_host_launch_robertson():
    """The thread kernel (Robertson, three rate directions): the custom call gives the host
    launch's numbers bit for bit, whole and for some states, under jit and under vmap (one
    call per batch element), and the compiled program holds no host callback."""
    from solver.backends.cuda.ffi_library import TARGET_NAME

    host, ffi = CudaBackend(sensitivity_launch="host"), CudaBackend(sensitivity_launch="ffi")
    k = jnp.asarray(ROBERTSON.params)[None]
    for saved in (None, (0, 2)):
        want = jax.block_until_ready(jax.jit(_with_tangents(host, saved))(k))
        run = jax.jit(_with_tangents(ffi, saved))
        got = jax.block_until_ready(run(k))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    hlo = run.lower(k).as_text()
    assert TARGET_NAME in hlo and "callback" not in hlo.lower()
    ks = jnp.stack([k, 1.1 * k])
    got = jax.block_until_ready(jax.vmap(_with_tangents(ffi))(ks))
    for i in range(2):
        want = _with_tangents(host)(ks[i])
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a)[i], np.asarray(b))


@pytest.mark.gpu
@pytest.mark.parametrize("dir_warps", [None, 2])
def test_ffi_sensitivities_equal_the_host_launch_eb(eb_small, dir_warps):
    """The warp kernel (the EB model, tangent tables, parameter and initial tangents; three
    directions, padded to four at two warps a block): bit for bit the host launch's."""
    from solver import solve_with_tangents

    model, table, params, x0, y0, xs, s0, dparams, dtable, spec = _eb_case(eb_small, 3)
    out = {}
    for launch in ("host", "ffi"):
        b = CudaBackend(direction_warps=dir_warps, sensitivity_launch=launch)

        def run(tab, q, y, dt, dq, dy, b=b):
            return solve_with_tangents(
                model.rhs, y, xs, q, dy0=dy, dparams=dq, dargs=dt, args=tab, t0=x0,
                rtol=EB_RTOL, atol=EB_ATOL, error_weights=spec.weights, backend=b,
                saved_states=(0, 3, 5))
        out[launch] = jax.block_until_ready(jax.jit(run)(
            *(jnp.asarray(a) for a in (table, params, y0, dtable, dparams, s0))))
    for a, b in zip(out["ffi"], out["host"]):
        assert np.all(np.isfinite(np.asarray(b)))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
