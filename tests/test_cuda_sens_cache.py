"""The sensitivity kernel from the on-disk kernel cache, launched through the CUDA driver
(solver/backends/cuda/launch_cubin.py, launch_numba.solve_sensitivities with a kernel cache).

CPU: the driver launch packs parameters as numba-cuda-mlir's launcher does (the layout the XLA
FFI handler also uses); the sensitivity kernel's cache key names its own entry; a first "process"
compiles and stores the image, a second loads it without compiling (compile mocked); the value
inside JAX programs is the FFI launch (whose image the cache also holds), not a host callback.

GPU (``-m gpu``): two fresh processes on one cache directory: the first compiles and stores the
sensitivity kernel, the second loads it without compiling; both give identical tangents, which
equal numba-cuda-mlir's own launch of the same kernel.
"""
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from solver import RODAS5P
from solver.backends.cuda.codegen import SENS_KERNEL_ARGS
from stiff_problems import ROBERTSON

TESTS = Path(__file__).resolve().parent


class _DeviceArray:
    """A stand-in for a numba device array: only the CUDA array interface."""

    def __init__(self, shape, ptr, typestr="<f8", strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


def test_parameters_packed_like_numba_cuda_mlir():
    """Arrays: allocated, aligned, offset, sizes, strides in elements (row-major when the
    interface gives none); floats as doubles, integers as int64; the count matches the FFI
    layout's for the same ranks."""
    from solver.backends.cuda.ffi_kernel import _IN_CODE, _F64_CODE, expected_param_count
    from solver.backends.cuda.launch_cubin import pack_parameters

    a = _DeviceArray((4, 3, 5), 0x1000)
    b = _DeviceArray((7,), 0x2000, typestr="<i4")
    c = _DeviceArray((2, 3), 0x3000, strides=(8, 16))  # column-major
    got = pack_parameters([a, 1e-6, b, np.int64(9), c, 3])
    values = [p.value for p in got]
    assert values == [0x1000, 0x1000, 0, 4, 3, 5, 15, 5, 1, 1e-6,
                      0x2000, 0x2000, 0, 7, 1, 9,
                      0x3000, 0x3000, 0, 2, 3, 1, 2, 3]
    assert isinstance(got[9], ctypes.c_double) and isinstance(got[15], ctypes.c_int64)
    assert all(ctypes.sizeof(p) == 8 for p in got)
    layout = np.array([_IN_CODE, 0, _F64_CODE, 0, _IN_CODE, 1, _F64_CODE, 1, _IN_CODE, 2,
                       _F64_CODE, 1])
    assert expected_param_count(layout, [3, 1, 2], []) == len(got)
    with pytest.raises(TypeError, match="device arrays, floats and integers"):
        pack_parameters([np.zeros(3)])  # a host array never reaches the driver
    with pytest.raises(TypeError, match="boolean"):
        pack_parameters([True])


def _sens_example(n=3, P=3, m=2):
    f8 = np.float64
    vals = {"y0": np.zeros((1, n), f8), "t0": np.zeros(1, f8), "t_end": np.zeros(1, f8),
            "t_save": np.zeros((1, 2), f8), "params": np.zeros((1, P), f8), "args": np.zeros(1),
            "s0": np.zeros((m, 1, n)), "dparams": np.zeros((m, 1, P)), "dargs": np.zeros((1, 1)),
            "rtol": 1e-6, "atol": np.zeros(n), "atol_s": np.zeros(n), "weights": np.ones((1, n)),
            "weights_s": np.ones((1, n)), "h0": np.zeros(1), "n_weighted": 3.0,
            "ys": np.zeros((1, 2, n)), "dys": np.zeros((m, 1, 2, n)), "t_out": np.zeros((m, 1)),
            "status": np.zeros((m, 1), np.int32), "n_accepted": np.zeros((m, 1), np.int32),
            "n_rejected": np.zeros((m, 1), np.int32), "n_traj": np.int64(1),
            "n_dir": np.int64(m)}
    return [vals[k] for k in SENS_KERNEL_ARGS]


def test_sensitivity_kernel_from_the_cache_without_compiling(monkeypatch, tmp_path):
    """A real sensitivity plan (host side) for Robertson, the device compile mocked: the first
    launch compiles and stores the image under a key of its own entry; a new plan on the same
    cache ("a second process") loads it and never compiles; a cache that cannot be used still
    launches through the driver, compiled."""
    from solver.backends.cuda import ffi_kernel, kernel_cache, launch_numba
    from solver.backends.cuda.plan import SensPlan, build_plan

    monkeypatch.setattr(kernel_cache, "compute_capability", lambda: "9.0")
    calls = {"compile": 0}
    name = "_ZN17rodas_sens_kernel11sens_kernelE"

    def fake_kernel(self, module_dir=None):
        return object()

    def fake_compile(disp, example):
        calls["compile"] += 1
        return type("Res", (), {"metadata": {"cubin": b"\x7fELF" + name.encode() + b"\0sens",
                                             "func_name": name, "ptx": ""}})()

    monkeypatch.setattr(SensPlan, "kernel", fake_kernel)
    monkeypatch.setattr(ffi_kernel, "compile_result", fake_compile)
    cache = kernel_cache.KernelCache(tmp_path / "cubin")
    plain = build_plan(ROBERTSON.rhs, 3, 3, max_steps=1000, tableau=RODAS5P)
    example = _sens_example()

    plan1 = SensPlan(plain)
    launch, info = launch_numba._cached_launch(plan1, example, cache, None)
    assert calls["compile"] == 1 and info["kernel_cache"] == "stored"
    assert info["launch"] == "cubin" and info["first_call_includes_compile"]
    assert info["kernel_entry"] == name and info["compile_seconds"] >= 0.0
    comps = kernel_cache.key_components(plan1, SENS_KERNEL_ARGS, example, entry="sens_kernel")
    assert comps["entry"] == "gpu:sens_kernel" and info["kernel_cache_key"] == \
        kernel_cache.cache_key(comps)
    plain_comps = kernel_cache.key_components(plain, SENS_KERNEL_ARGS, example)
    assert kernel_cache.cache_key(plain_comps) != info["kernel_cache_key"]
    entry = json.loads((cache.root / f"{info['kernel_cache_key']}.json").read_text())
    assert entry["n_params"] == sum(3 + 2 * x.ndim if isinstance(x, np.ndarray) else 1
                                    for x in example)
    # the same plan again: loaded once, nothing new
    _, again = launch_numba._cached_launch(plan1, example, cache, None)
    assert calls["compile"] == 1 and again["compile_seconds"] == 0.0

    def no_compile(*a, **k):
        raise AssertionError("compiled despite a valid cache entry")

    monkeypatch.setattr(ffi_kernel, "compile_result", no_compile)
    monkeypatch.setattr(SensPlan, "kernel", no_compile)
    _, info2 = launch_numba._cached_launch(SensPlan(plain), example, cache, None)
    assert info2["kernel_cache"] == "hit" and info2["kernel_from_cache"]
    assert not info2["first_call_includes_compile"] and info2["compile_seconds"] == 0.0
    assert info2["kernel_cache_key"] == info["kernel_cache_key"]
    assert info2["cached_compile_seconds"] == pytest.approx(info["compile_seconds"])
    assert cache.stats["hits"] == 1 and cache.stats["stores"] == 1

    monkeypatch.setattr(ffi_kernel, "compile_result", fake_compile)
    monkeypatch.setattr(SensPlan, "kernel", fake_kernel)
    monkeypatch.setattr(kernel_cache, "compute_capability", lambda: None)
    _, info3 = launch_numba._cached_launch(SensPlan(plain), example, cache, None)
    assert info3["kernel_cache"] == "unavailable" and calls["compile"] == 2


# ----------------------------------------------------------------------------- GPU
_GPU_SCRIPT = """
import json, sys
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
from solver.backends.cuda.kernel_cache import KernelCache
from solver.backends.cuda.launch_numba import solve_sensitivities
from stiff_problems import ROBERTSON, robertson_ensemble
N = 4
y0, ts, params = robertson_ensemble(N, 8)
dp = np.broadcast_to(np.eye(3)[:, None, :], (3, N, 3)) * params[None]
kw = dict(dparams=dp, rtol=1e-6, atol=1e-12)
sol = solve_sensitivities(ROBERTSON.rhs, y0, ts, params,
                          kernel_cache=KernelCache(sys.argv[2]), **kw)
out = dict(ys=sol.ys, dys=sol.dys, st=sol.status, nacc=sol.n_accepted)
if sys.argv[3] == "numba":
    ref = solve_sensitivities(ROBERTSON.rhs, y0, ts, params, **kw)
    out.update(ref_ys=ref.ys, ref_dys=ref.dys, ref_nacc=ref.n_accepted)
np.savez(sys.argv[1], **out)
info = {k: v for k, v in sol.info.items() if isinstance(v, (bool, int, float, str, type(None)))}
info["numba_cuda_mlir_imported"] = "numba_cuda_mlir" in sys.modules
print("INFO " + json.dumps(info))
"""


@pytest.mark.gpu
def test_sensitivity_kernel_second_process_loads_instead_of_compiling(tmp_path):
    """Process 1 compiles and stores the sensitivity kernel and also launches it through
    numba-cuda-mlir (no cache): same numbers bit for bit. Process 2 loads it from the cache
    without compiling, on driver-allocated arrays, and never imports numba-cuda-mlir: same
    numbers again."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS),
                                           os.environ.get("PYTHONPATH", "")]))
    infos, results = [], []
    for run, mode in enumerate(("numba", "cache")):
        out_file = tmp_path / f"run{run}.npz"
        out = subprocess.run([sys.executable, "-c", _GPU_SCRIPT, str(out_file),
                              str(tmp_path / "cubin"), mode],
                             capture_output=True, text=True, env=env, timeout=1800)
        assert out.returncode == 0, out.stdout + out.stderr
        info = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("INFO ")][-1][5:])
        print(f"process {run + 1}: kernel_cache={info['kernel_cache']} "
              f"kernel_seconds={info['kernel_seconds']:.3f} "
              f"compile_seconds={info['compile_seconds']:.3f}")
        infos.append(info)
        results.append(dict(np.load(out_file)))
    first, second = infos
    assert first["launch"] == second["launch"] == "cubin"
    assert first["kernel_cache"] == "stored" and first["first_call_includes_compile"]
    assert second["kernel_cache"] == "hit" and not second["first_call_includes_compile"]
    assert second["compile_seconds"] == 0.0 and second["kernel_entry"] == first["kernel_entry"]
    assert first["numba_cuda_mlir_imported"] and not second["numba_cuda_mlir_imported"]
    assert np.all(results[0]["st"] == 0)
    for name in ("ys", "dys", "nacc"):
        np.testing.assert_array_equal(results[0][name], results[0]["ref_" + name], err_msg=name)
        np.testing.assert_array_equal(results[1][name], results[0][name], err_msg=name)


class _FakeDriver:
    """libcuda's memory calls on host memory: what ``DeviceBuffer`` asks of the driver."""

    def __init__(self):
        self.blocks, self.freed, self.copies2d = {}, [], []

    def cuCtxGetCurrent(self, ctx):
        ctypes.cast(ctx, ctypes.POINTER(ctypes.c_void_p))[0] = 0x1
        return 0

    def cuMemAlloc_v2(self, ptr, size):
        block = ctypes.create_string_buffer(size.value)
        address = ctypes.addressof(block)
        self.blocks[address] = block
        ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint64))[0] = address
        return 0

    def cuMemcpyHtoD_v2(self, dst, src, size):
        ctypes.memmove(dst.value, src, size.value)
        return 0

    def cuMemcpyDtoH_v2(self, dst, src, size):
        ctypes.memmove(dst, src.value, size.value)
        return 0

    def cuMemsetD8_v2(self, ptr, value, size):
        ctypes.memset(ptr.value, value.value, size.value)
        return 0

    def cuMemcpy2D_v2(self, ref):
        """Device to device only (as ``copy_columns_to_host`` asks): Height rows of
        WidthInBytes, each side from its X offset and at its pitch."""
        cp = ref._obj
        assert (cp.srcMemoryType, cp.dstMemoryType) == (2, 2)
        self.copies2d.append((cp.WidthInBytes, cp.Height))
        for row in range(cp.Height):
            ctypes.memmove(cp.dstDevice + cp.dstXInBytes + row * cp.dstPitch,
                           cp.srcDevice + cp.srcXInBytes + row * cp.srcPitch, cp.WidthInBytes)
        return 0

    def cuMemFree_v2(self, ptr):
        self.freed.append(ptr.value)
        return 0


def test_device_buffer_copies_through_the_driver(monkeypatch):
    """``DeviceBuffer``: the host array copied in and read back unchanged (any layout, made
    C-contiguous), its ``__cuda_array_interface__`` packs as numba's arrays do, and it is
    freed once."""
    from solver.backends.cuda import launch_cubin

    fake = _FakeDriver()
    monkeypatch.setattr(launch_cubin, "_DRIVER", fake)
    host = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2]       # not contiguous
    buf = launch_cubin.DeviceBuffer(host)
    np.testing.assert_array_equal(buf.copy_to_host(), host)
    cai = buf.__cuda_array_interface__
    assert cai["shape"] == (4, 3) and cai["typestr"] == "<f8" and cai["data"][0] == buf.ptr
    packed = [p.value for p in launch_cubin.pack_parameters([buf])]
    assert packed == [buf.ptr, buf.ptr, 0, 4, 3, 3, 1]
    ints = launch_cubin.DeviceBuffer(np.array([3, -1], np.int32))
    np.testing.assert_array_equal(ints.copy_to_host(), [3, -1])
    empty = launch_cubin.DeviceBuffer(np.zeros((0, 5)))
    assert empty.copy_to_host().shape == (0, 5)
    # some entries of the last axis, of the first rows: a strided copy per run of columns
    wide = np.random.default_rng(0).normal(size=(3, 4, 5, 9))
    cols = [0, 1, 2, 5, 7, 8]
    assert launch_cubin.column_runs(cols) == [(0, 0, 3), (5, 3, 1), (7, 4, 2)]
    part = launch_cubin.DeviceBuffer(wide).copy_columns_to_host(cols, leading=2)
    np.testing.assert_array_equal(part, wide[:2][..., cols])
    assert fake.copies2d == [(24, 40), (8, 40), (16, 40)]
    # gathered on the device into a compact buffer (the last allocation), then released
    assert list(fake.blocks)[-1] in fake.freed
    with pytest.raises(ValueError, match="outside"):
        launch_cubin.DeviceBuffer(wide).copy_columns_to_host([8, 9])
    ptr = buf.ptr
    buf.free()
    buf.free()
    del buf
    assert fake.freed.count(ptr) == 1


def test_value_inside_jax_programs_is_the_ffi_launch(monkeypatch):
    """``solve_diff``'s and ``solve_with_tangents``' value on the CUDA backend goes through the
    FFI custom call (whose image the kernel cache holds), not a host callback that numba-cuda-mlir
    would compile in every process; the emulator keeps the callback."""
    import jax.numpy as jnp

    from solver import CudaBackend
    from solver.sensitivity.spec import _spec

    monkeypatch.setattr(CudaBackend, "check_sensitivities", lambda self, spec: None)
    backend = CudaBackend(launch="auto")
    monkeypatch.setattr(backend, "use_ffi", lambda: True)
    seen = {}

    def fake_solve_jax(rhs, y0, t_save, params, **kw):
        seen.update(kw, rhs=rhs)
        return (jnp.full((y0.shape[0], t_save.shape[1], y0.shape[1]), 7.0),)

    monkeypatch.setattr(backend.ffi, "solve_jax", fake_solve_jax)
    N, n = 2, 3
    table = jnp.arange(4.0)
    spec = _spec(ROBERTSON.rhs, n, 3, table, 1e-6, 1e-9, None, None, True, 1000,
                 {"backend": backend, "first_step": 1e-6})
    ts = jnp.tile(jnp.array([0.0, 1.0]), (N, 1))
    ys = backend.solve_ys(spec, jnp.ones((N, n)), jnp.ones((N, 3)), table, ts, jnp.zeros(N),
                          jnp.ones(N))
    assert ys.shape == (N, 2, n) and float(ys[0, 0, 0]) == 7.0
    assert seen["rhs"] is ROBERTSON.rhs and seen["args"] is table
    assert seen["rtol"] == 1e-6 and seen["max_steps"] == 1000 and seen["first_step"] == 1e-6
    np.testing.assert_array_equal(seen["atol"], np.full(n, 1e-9))
    np.testing.assert_array_equal(seen["error_weights"], np.ones(n))
    np.testing.assert_array_equal(seen["t_end"], np.ones(N))
    assert seen["tableau"] is RODAS5P
    # the emulator (CPU tests) keeps the host callback: a real solve, the FFI never reached
    emulated = CudaBackend(launch="emulated")
    monkeypatch.setattr(emulated.ffi, "solve_jax", lambda *a, **k: pytest.fail("FFI used"))
    spec = _spec(ROBERTSON.rhs, n, 3, None, 1e-6, 1e-10, None, None, True, 1000,
                 {"backend": emulated})
    y0 = jnp.tile(jnp.asarray(ROBERTSON.y0), (N, 1))
    ys = emulated.solve_ys(spec, y0, jnp.tile(jnp.asarray(ROBERTSON.params), (N, 1)), None, ts,
                           jnp.zeros(N), jnp.ones(N))
    assert np.all(np.isfinite(ys)) and float(ys[0, 0, 0]) == 1.0
    assert abs(float(jnp.sum(ys[0, 1])) - 1.0) < 1e-8   # Robertson conserves the total
