"""The CUDA backend's JAX interop: the XLA FFI launch (solver/backends/cuda/launch_ffi.py,
ffi_kernel.py, ffi_library.py, csrc/rodas_ffi.cc); its on-disk kernel cache is tested in
tests/test_cuda_kernel_cache.py.

CPU (no GPU needed, g++ needed): the handler library builds against this jaxlib's FFI headers and
exports its symbols; the build is cached; missing compiler / compile errors are reported clearly;
and a host-platform twin of the handler (same attribute decoding and parameter packing, no launch)
shows, through a real ``jax.ffi.ffi_call``, that the kernel parameters are packed as
numba-cuda-mlir's kernels expect them (arrays as allocated, aligned, offset, sizes, strides), also
under ``jax.jit`` and with ``jax.vmap`` folded into one call.

GPU (``-m gpu``): ``solve_jax`` against the plain numba launch of the same kernel (same step
counts) and ``backend="jax"`` (within 20 tolerances, as in tests/test_cuda_backend.py: two
solutions each within 10 of the truth), under ``jax.jit``, and ``jax.vmap`` over an extra leading
batch axis = one launch with the unbatched calls' numbers.
"""
import ctypes
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from solver import RODAS5P, CudaBackend, CudaBackendUnavailable, Status, solve
from stiff_problems import ROBERTSON, VAN_DER_POL

needs_gxx = pytest.mark.skipif(
    shutil.which("g++") is None,
    reason="g++ not found: the XLA FFI handler (solver/backends/cuda/csrc/rodas_ffi.cc) cannot be "
           "built here")

#: the FFI launch (its handler library in the scratch directory, no kernel cache)
FFI = CudaBackend(launch="ffi")
TESTS = Path(__file__).resolve().parent


def _probe(rhs, y0, ts, params, **kw):
    """The whole solve_jax path on the CPU, with the packing twin of the handler as the target;
    returns the 6th output, the dump (rows: [n_slots, slot bits..., -1 ...])."""
    opts = dict(args=None, rtol=1e-6, atol=1e-9, t0=None, t_end=None, sparsity=None,
                error_weights=None, max_steps=1000, first_step=None, controller=None,
                tableau=RODAS5P)
    opts.update(kw)
    return FFI.solve_jax(rhs, y0, ts, params, probe=True, jit_eager=False, **opts)[5]


def _bits(x):
    return int(np.float64(x).view(np.int64))


def _array_slots(dump, pos, shape):
    """Check one array's 3 + 2r slots at ``pos``; returns the next position."""
    r = len(shape)
    ptr, aligned, offset = dump[pos:pos + 3]
    assert ptr == aligned and ptr != 0 and offset == 0
    assert list(dump[pos + 3:pos + 3 + r]) == list(shape)
    strides = [int(np.prod(shape[k + 1:])) for k in range(r)]
    assert list(dump[pos + 3 + r:pos + 3 + 2 * r]) == strides  # row-major, in elements
    return pos + 3 + 2 * r


def check_slots(dump, kernel_args, shapes, scalars):
    """Every kernel argument's slots in order: arrays by ``shapes``, scalars by ``scalars``
    (their int64 bits), nothing after them."""
    pos = 1
    for name in kernel_args:
        if name in shapes:
            pos = _array_slots(dump, pos, shapes[name])
        else:
            assert dump[pos] == scalars[name], name
            pos += 1
    assert dump[0] == pos - 1 and np.all(dump[pos:] == -1)


# ----------------------------------------------------------------------------- CPU: the library
@needs_gxx
def test_library_builds_and_exports_symbols():
    from solver.backends.cuda.ffi_library import ABI_VERSION

    lib = FFI.ffi_library
    path = lib.path()
    assert path.is_file() and path.suffix == ".so"
    cdll = ctypes.CDLL(str(path))
    for sym in ("BoltzmannRodasSolve", "BoltzmannRodasPackProbe", "rodas_ffi_abi_version",
                "rodas_ffi_register_kernel", "rodas_ffi_launch_count",
                "rodas_ffi_driver_status"):
        assert hasattr(cdll, sym), sym
    assert lib.load().rodas_ffi_abi_version() == ABI_VERSION
    # cached: a second lookup neither rebuilds nor moves it
    mtime = path.stat().st_mtime_ns
    assert lib.path() == path and path.stat().st_mtime_ns == mtime
    # no GPU here: the driver status names the reason instead of crashing
    assert isinstance(lib.driver_status(), str)


def test_backend_settings_become_paths(tmp_path):
    """cache_root holds the kernel cache and the handler build; without one there is no kernel
    cache and the build goes to the scratch directory."""
    b = CudaBackend(cache_root=tmp_path, cxx="clang++")
    assert b.kernel_cache.root == tmp_path / "cubin" and b.module_dir == tmp_path
    assert b.ffi_library.build_dir == tmp_path / "ffi" and b.ffi_library.cxx == "clang++"
    plain = CudaBackend()
    assert plain.kernel_cache is None and plain.ffi_library.build_dir.name == "ffi"
    pre = CudaBackend(ffi_library=tmp_path / "missing.so")
    from solver.backends.cuda import FfiBuildError
    with pytest.raises(FfiBuildError, match="missing.so"):
        pre.ffi_library.path()


def test_missing_compiler_is_a_clear_error(tmp_path):
    from solver.backends.cuda import FfiLibrary

    lib = FfiLibrary(tmp_path, cxx="no-such-compiler-for-boltzmann")
    with pytest.raises(CudaBackendUnavailable, match="C\\+\\+ compiler.*g\\+\\+"):
        lib.build(tmp_path / "x.so")


@needs_gxx
def test_compile_error_shows_compiler_output(tmp_path):
    from solver.backends.cuda import FfiBuildError, FfiLibrary

    bad = tmp_path / "broken.cc"
    bad.write_text("int broken( {\n")
    with pytest.raises(FfiBuildError, match="(?s)building the XLA FFI handler failed.*"
                                            "broken.cc.*error"):
        FfiLibrary(tmp_path, source=bad).build(tmp_path / "x.so")
    assert not list(tmp_path.glob("*.so"))


# ----------------------------------------------------------------------------- CPU: layout
def test_layout_covers_kernel_args():
    from solver.backends.cuda.codegen import KERNEL_ARGS
    from solver.backends.cuda.ffi_kernel import layout

    codes = layout(KERNEL_ARGS, 1)
    assert codes.size == 2 * len(KERNEL_ARGS)
    with pytest.raises(CudaBackendUnavailable, match="bogus"):
        layout(KERNEL_ARGS + ("bogus",), 1)


def test_ptx_entry_parser():
    from solver.backends.cuda.ffi_kernel import ptx_entry_param_sizes

    ptx = """
.visible .entry _Z6kernelPd(
\t.param .u64 _Z6kernelPd_param_0,
\t.param .f64 _Z6kernelPd_param_1,
\t.param .u32 _Z6kernelPd_param_2,
\t.param .align 8 .b8 _Z6kernelPd_param_3[24],
\t.param .u64 .ptr .global .align 8 _Z6kernelPd_param_4
)
{ ret; }"""
    assert ptx_entry_param_sizes(ptx, "_Z6kernelPd") == [8, 8, 4, 24, 8]
    assert ptx_entry_param_sizes(ptx, "other") is None


def test_kernel_image_extraction():
    from solver.backends.cuda.ffi_kernel import kernel_image

    class Res:
        def __init__(self, meta):
            self.metadata = meta

    image, name, ptx = kernel_image(Res({"cubin": b"\x7fELF..kern..", "func_name": "kern",
                                          "ptx": ".entry kern()"}), object())
    assert image.startswith(b"\x7fELF") and name == "kern" and ptx == ".entry kern()"
    with pytest.raises(CudaBackendUnavailable, match="metadata keys \\['ptx'\\]"):
        kernel_image(Res({"ptx": "x"}), object())
    with pytest.raises(CudaBackendUnavailable, match="setup callbacks"):
        kernel_image(Res({"cubin": b"kern", "func_name": "kern", "setup_callbacks": [print]}),
                      object())


def test_compile_result_falls_back_to_one_launch():
    from solver.backends.cuda.ffi_kernel import compile_result

    class Res:
        metadata = {"cubin": b"kern", "func_name": "kern"}

    class Disp:
        def __init__(self):
            self.overloads, self.launched = {}, []

        def compile_for(self, *a):
            raise RuntimeError("whole-function planner requires launch metadata")

        def __getitem__(self, cfg):
            def launch(*a):
                self.launched.append((cfg, a))
                self.overloads[("sig",)] = Res()
            return launch

    d = Disp()
    assert isinstance(compile_result(d, (1.0, 2)), Res) and d.launched == [((1, 32), (1.0, 2))]

    class Broken(Disp):
        def __getitem__(self, cfg):
            raise ValueError("no GPU")

    with pytest.raises(CudaBackendUnavailable, match="(?s)compile_for: RuntimeError.*no GPU"):
        compile_result(Broken(), ())


@needs_gxx
@pytest.mark.parametrize("per_trajectory", [False, True])
def test_parameters_packed_as_numba_cuda_mlir_expects(per_trajectory):
    """Through a real ffi_call: every kernel argument in KERNEL_ARGS order, arrays expanded.
    Shared error weights reach the kernel as one row with their count; per-trajectory weights
    as a row each, divided by the square root of the row's count, with a count of 1."""
    from solver.backends.cuda.codegen import KERNEL_ARGS

    N, m = 3, 4
    y0 = np.tile(ROBERTSON.y0, (N, 1))
    params = np.tile(ROBERTSON.params, (N, 1))
    ts = np.array([0.0, 1.0, 10.0, 100.0])
    w = np.array([1.0, 0.0, 1.0])
    if per_trajectory:
        w = np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 2.0]])
    dump = np.asarray(_probe(ROBERTSON.rhs, y0, ts, params, rtol=1e-5, atol=1e-12,
                             error_weights=w))[0]
    n = 3
    shapes = {"y0": (N, n), "t0": (N,), "t_end": (N,), "t_save": (N, m), "params": (N, 3),
              "args": (1,), "atol": (n,), "weights": (N if per_trajectory else 1, n),
              "h0": (N,), "ys": (N, m, n),
              "t_out": (N,), "status": (N,), "n_accepted": (N,), "n_rejected": (N,)}
    scalars = {"rtol": _bits(1e-5), "n_weighted": _bits(1.0 if per_trajectory else 2.0),
               "n_traj": N}
    check_slots(dump, KERNEL_ARGS, shapes, scalars)


@needs_gxx
def test_jit_and_vmap_fold_into_one_call():
    from solver.backends.cuda.ffi_library import PROBE_TARGET_NAME

    N, B1, B2 = 2, 3, 2
    ts = np.linspace(0.0, 3000.0, 5)
    y0 = np.tile(VAN_DER_POL.y0, (B2, B1, N, 1)) * (1 + 0.1 * np.arange(B2))[:, None, None, None]
    params = np.tile(VAN_DER_POL.params, (N, 1))

    def f(y0):
        return _probe(VAN_DER_POL.rhs, y0, ts, params)

    run = jax.jit(jax.vmap(jax.vmap(f)))
    hlo = run.lower(jnp.asarray(y0)).as_text()
    # ONE custom call in the program, on the folded ensemble (vmap levels only re-trace)
    assert hlo.count(PROBE_TARGET_NAME) == 1, hlo
    dump = np.asarray(run(jnp.asarray(y0)))
    assert dump.shape[:3] == (B2, B1, N)
    first = dump[0, 0, 0]
    assert first[0] > 0 and first[first[0]] == B2 * B1 * N  # n_traj, the last kernel argument
    assert _array_slots(first, 1, (B2 * B1 * N, 2)) > 1     # y0 folded to (B2*B1*N, n)
    # unbatched params are broadcast into the folded ensemble
    g = jax.vmap(f)
    assert jax.jit(g).lower(jnp.asarray(y0[0])).as_text().count(PROBE_TARGET_NAME) == 1
    dump2 = np.asarray(g(jnp.asarray(y0[0])))
    assert dump2[0, 0][dump2[0, 0][0]] == B1 * N


def _table_rhs(y, t, p, args):
    return (-p[0] * y[0] * args[0, 0],)


class _FakeSplit:  # what cuda.tables.table_split_of looks for (the probe never runs it)
    n_tv = 1
    core = core_device = lookup = lookup_device = lookup_dt_device = staticmethod(print)


_table_rhs.table_split = _FakeSplit()


@needs_gxx
def test_tables_pass_through_and_vmap_over_them_is_one_call_each():
    N, B = 2, 3
    ts = np.linspace(0.0, 1.0, 3)
    y0 = np.ones((N, 1))
    params = np.ones((N, 1))
    tables = np.arange(10.0).reshape(2, 5)

    def f(tab, y0=y0):
        return _probe(_table_rhs, y0, ts, params, args=tab)

    dump = np.asarray(f(jnp.asarray(tables)))[0]
    # args is the 6th kernel argument: after y0 (7 slots), t0, t_end (5), t_save, params (7)
    assert _array_slots(dump, 1 + 7 + 5 + 5 + 7 + 7, (2, 5)) > 0
    # vmap over y0 with shared tables: folded
    dump = np.asarray(jax.vmap(lambda y: f(jnp.asarray(tables), y))(jnp.ones((B, N, 1))))
    assert dump[0, 0][dump[0, 0][0]] == B * N
    # vmap over the tables: they cannot share a launch, so one call per batch element
    dump = np.asarray(jax.vmap(f)(jnp.asarray(np.stack([tables] * B))))
    assert all(dump[b, 0][dump[b, 0][0]] == N for b in range(B))


def test_solve_jax_needs_a_gpu():
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    with pytest.raises(CudaBackendUnavailable, match="CUDA GPU"):
        FFI.solve_jax(VAN_DER_POL.rhs, VAN_DER_POL.y0[None], [0.0, 1.0], VAN_DER_POL.params[None])




# ----------------------------------------------------------------------------- GPU
CASES = {
    "robertson": (ROBERTSON, np.concatenate([[0.0], np.logspace(-4, 5, 10)]), 1e-6, 1e-12),
    "van_der_pol": (VAN_DER_POL, np.linspace(0.0, 3000.0, 7), 1e-6, 1e-9),
}


def _ensemble(prob, N, spread=0.2, seed=0):
    rng = np.random.default_rng(seed)
    params = prob.params[None, :] * (1.0 + spread * (rng.random((N, prob.params.size)) - 0.5))
    return np.tile(prob.y0, (N, 1)), params


def _close(ref, ys, status, rtol, atol, bound):
    ok = np.asarray(status) == Status.OK
    ya, yb = np.asarray(ref)[ok], np.asarray(ys)[ok]
    assert np.all(np.isfinite(yb))
    ratio = np.abs(ya - yb) / (rtol * np.abs(ya) + atol)
    assert ratio.max() <= bound, f"max |diff|/tol = {ratio.max():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_ffi_matches_numba_launch_and_jax(name):
    prob, ts, rtol, atol = CASES[name]
    y0, params = _ensemble(prob, 8)
    ys, t, st, nacc, nrej = FFI.solve_jax(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
    # the plain numba launch of the same kernel
    numba = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol,
                  backend=CudaBackend(launch="numba"))
    assert numba.info["launch"] == "numba"
    ref = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
    for other in (numba, ref):
        assert np.asarray(st).tolist() == np.asarray(other.status).tolist()
    assert np.all(np.asarray(st) == Status.OK)
    np.testing.assert_allclose(np.asarray(t), np.asarray(ref.t_final), rtol=1e-14)
    # the same kernel as the plain launch: the same steps, the same numbers within 10 tol
    assert np.asarray(nacc).tolist() == np.asarray(numba.n_accepted).tolist()
    assert np.asarray(nrej).tolist() == np.asarray(numba.n_rejected).tolist()
    _close(numba.ys, ys, st, rtol, atol, 10.0)
    _close(ref.ys, ys, st, rtol, atol, 20.0)
    sol = solve(prob.rhs, y0, ts, params, rtol=rtol, atol=atol, backend=FFI)
    assert sol.backend == "cuda" and sol.info["launch"] == "xla-ffi"
    assert sol.info["jacobian_colors"] == numba.info["jacobian_colors"]
    np.testing.assert_array_equal(np.asarray(sol.ys), np.asarray(ys))


@pytest.mark.gpu
def test_ffi_under_jit():
    prob, ts, rtol, atol = CASES["van_der_pol"]
    y0, params = _ensemble(prob, 8)

    @jax.jit
    def run(y0, params, t_end):
        ys, _, st, _, _ = FFI.solve_jax(prob.rhs, y0, ts, params, rtol=rtol, atol=atol,
                                        t_end=t_end)
        return ys, st

    ys, st = run(jnp.asarray(y0), jnp.asarray(params), ts[-1])
    eager = FFI.solve_jax(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(np.asarray(st), np.asarray(eager[2]))
    np.testing.assert_array_equal(np.asarray(ys), np.asarray(eager[0]))


@pytest.mark.gpu
@pytest.mark.parametrize("batched_params", [True, False])
def test_vmap_is_one_launch(batched_params):
    prob, ts, rtol, atol = CASES["van_der_pol"]
    B, N = 3, 4
    batches = [_ensemble(prob, N, seed=s) for s in range(B)]
    y0b = np.stack([b[0] * (1.0 + 0.05 * k) for k, b in enumerate(batches)])
    pb = np.stack([b[1] for b in batches]) if batched_params else batches[0][1]

    def f(y0, params):
        return FFI.solve_jax(prob.rhs, y0, ts, params, rtol=rtol, atol=atol)

    run = jax.jit(jax.vmap(f, in_axes=(0, 0 if batched_params else None)))
    before = FFI.ffi_library.launch_count()
    out = jax.block_until_ready(run(jnp.asarray(y0b), jnp.asarray(pb)))
    assert FFI.ffi_library.launch_count() == before + 1
    assert out[0].shape == (B, N, ts.size, prob.n)
    for k in range(B):
        one = f(y0b[k], pb[k] if batched_params else pb)
        for a, b in zip(out, one):
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b))


def test_launch_mode_selection(monkeypatch):
    """launch="auto" (the default) takes the FFI launch and falls back to the numba launch with
    a warning when the handler cannot be built; "ffi" raises instead; bad values are a clear
    error."""
    from solver.backends.cuda import FfiBuildError

    with pytest.raises(ValueError, match="launch must be one of"):
        CudaBackend(launch="xla")
    assert CudaBackend(launch="numba").use_ffi() is False
    assert CudaBackend(launch="emulated").use_ffi() is False

    def broken():
        raise FfiBuildError("g++ not found")

    auto = CudaBackend()
    monkeypatch.setattr(auto.ffi_library, "load", broken)
    with pytest.warns(RuntimeWarning, match="g\\+\\+ not found"):
        assert auto.use_ffi() is False
    ffi = CudaBackend(launch="ffi")
    monkeypatch.setattr(ffi.ffi_library, "load", broken)
    with pytest.raises(FfiBuildError, match="g\\+\\+ not found"):
        ffi.use_ffi()
    working = CudaBackend(launch="auto")
    monkeypatch.setattr(working.ffi_library, "load", lambda: object())
    assert working.use_ffi() is True
