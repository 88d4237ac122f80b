"""The CUDA backend's JAX interop: the XLA FFI launch (solver/backends/cuda/launch_ffi.py,
ffi_kernel.py, ffi_library.py, csrc/rodas_ffi.cc) and its on-disk kernel cache (kernel_cache.py).

CPU (no GPU needed, g++ needed): the handler library builds against this jaxlib's FFI headers and
exports its symbols; the build is cached; missing compiler / compile errors are reported clearly;
and a host-platform twin of the handler (same attribute decoding and parameter packing, no launch)
shows, through a real ``jax.ffi.ffi_call``, that the kernel parameters are packed as
numba-cuda-mlir's kernels expect them (arrays as allocated, aligned, offset, sizes, strides), also
under ``jax.jit`` and with ``jax.vmap`` folded into one call. The kernel cache's key covers each
component, entries round-trip, corrupt ones are rejected, and registration takes the cache branch
without compiling (the compile mocked).

GPU (``-m gpu``): ``solve_jax`` against the plain numba launch of the same kernel (same step
counts) and ``backend="jax"`` (within 20 tolerances, as in tests/test_cuda_backend.py: two
solutions each within 10 of the truth), under ``jax.jit``, and ``jax.vmap`` over an extra leading
batch axis = one launch with the unbatched calls' numbers; a second process loads the first one's
cubin from the kernel cache.
"""
import ctypes
import os
import shutil
import sys
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
def test_parameters_packed_as_numba_cuda_mlir_expects():
    """Through a real ffi_call: every kernel argument in KERNEL_ARGS order, arrays expanded."""
    from solver.backends.cuda.codegen import KERNEL_ARGS

    N, m = 3, 4
    y0 = np.tile(ROBERTSON.y0, (N, 1))
    params = np.tile(ROBERTSON.params, (N, 1))
    ts = np.array([0.0, 1.0, 10.0, 100.0])
    dump = np.asarray(_probe(ROBERTSON.rhs, y0, ts, params, rtol=1e-5, atol=1e-12,
                             error_weights=np.array([1.0, 0.0, 1.0])))[0]
    n = 3
    shapes = {"y0": (N, n), "t0": (N,), "t_end": (N,), "t_save": (N, m), "params": (N, 3),
              "args": (1,), "atol": (n,), "weights": (n,), "h0": (N,), "ys": (N, m, n),
              "t_out": (N,), "status": (N,), "n_accepted": (N,), "n_rejected": (N,)}
    scalars = {"rtol": _bits(1e-5), "n_weighted": _bits(2.0), "n_traj": N}
    pos = 1
    for name in KERNEL_ARGS:
        if name in shapes:
            pos = _array_slots(dump, pos, shapes[name])
        else:
            assert dump[pos] == scalars[name], name
            pos += 1
    assert dump[0] == pos - 1 and np.all(dump[pos:] == -1)


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


# ----------------------------------------------------------------------------- CPU: kernel cache
_VERSIONS = {"numba-cuda-mlir": "0.5.4", "numba-enzyme-cuda": "0.2.2", "numba": "0.61.0"}


@pytest.fixture
def kcache(monkeypatch, tmp_path):
    """A private kernel cache, a fixed compute capability and fixed versions (no GPU, no
    numba-cuda-mlir here)."""
    from solver.backends.cuda import kernel_cache

    monkeypatch.setattr(kernel_cache, "compute_capability", lambda: "9.0")
    monkeypatch.setattr(kernel_cache, "dist_version", lambda dist: _VERSIONS.get(dist, "unknown"))
    return kernel_cache.KernelCache(tmp_path / "cubin")


def _fake_plan(source="def kernel(): pass\n", rhs=ROBERTSON.rhs, split=None):
    from types import SimpleNamespace

    return SimpleNamespace(source=source, rhs=rhs, split=split)


def _closure_rhs(c):
    def rhs(y, t, p):
        return (-c * y[0],)
    return rhs


_GLOBAL_RATE = 2.0


def _global_rhs(y, t, p):
    return (-_GLOBAL_RATE * y[0],)


def test_kernel_cache_key_covers_every_component(kcache, monkeypatch):
    from solver.backends.cuda import kernel_cache as kc

    names = ("y0", "rtol", "n_traj")
    example = (np.zeros((1, 3)), 1e-6, np.int64(1))

    def key(plan=None, ex=example):
        comps = kc.key_components(plan or _fake_plan(), names, ex)
        return kc.cache_key(comps)

    base = key()
    assert base == key() and len(base) == 64                     # stable
    assert key(_fake_plan(rhs=_closure_rhs(1.0))) == key(_fake_plan(rhs=_closure_rhs(1.0)))
    variants = {
        "source": key(_fake_plan(source="def kernel(): return\n")),
        "rhs": key(_fake_plan(rhs=VAN_DER_POL.rhs)),
        "closure value": key(_fake_plan(rhs=_closure_rhs(2.0))),
        "arg dtype": key(ex=(np.zeros((1, 3), np.float32), 1e-6, np.int64(1))),
        "arg rank": key(ex=(np.zeros(3), 1e-6, np.int64(1))),
        "arg order": key(ex=(np.zeros((2, 3), order="F"), 1e-6, np.int64(1))),
        "scalar type": key(ex=(np.zeros((1, 3)), 1e-6, 1.0)),
    }
    variants["closure rhs"] = key(_fake_plan(rhs=_closure_rhs(1.0)))
    g0 = key(_fake_plan(rhs=_global_rhs))
    monkeypatch.setattr(sys.modules[__name__], "_GLOBAL_RATE", 3.0)
    variants["global value"] = key(_fake_plan(rhs=_global_rhs))
    variants["global value 0"] = g0
    for dist in _VERSIONS:
        with monkeypatch.context() as m:
            m.setattr(kc, "dist_version",
                      lambda d, dist=dist: "9.9" if d == dist else _VERSIONS.get(d, "unknown"))
            variants[dist] = key()
    for attr, value in (("KERNEL_ENTRY", "sens_kernel"), ("KERNEL_MODULE_TAG", "gpu2"),
                        ("CACHE_FORMAT", kc.CACHE_FORMAT + 1),
                        ("compute_capability", lambda: "8.0"),
                        ("THREADS_PER_BLOCK", 64)):
        with monkeypatch.context() as m:
            m.setattr(kc, attr, value)
            variants[attr] = key()
    assert base == key()  # restored
    keys = [base, *variants.values()]
    assert len(set(keys)) == len(keys), {k: v for k, v in variants.items() if v == base}
    # a table split: its three device functions are keyed, not rhs
    split = type("S", (), {"core_device": staticmethod(ROBERTSON.rhs),
                           "lookup_device": staticmethod(_global_rhs),
                           "lookup_dt_device": staticmethod(_global_rhs)})()
    split2 = type("S", (), {"core_device": staticmethod(ROBERTSON.rhs),
                            "lookup_device": staticmethod(_global_rhs),
                            "lookup_dt_device": staticmethod(VAN_DER_POL.rhs)})()
    assert key(_fake_plan(split=split)) != key(_fake_plan(split=split2))
    # no compute capability, or an rhs reading something it cannot pin down: no cache
    monkeypatch.setattr(kc, "compute_capability", lambda: None)
    assert kc.key_components(_fake_plan(), names, example) is None
    monkeypatch.setattr(kc, "compute_capability", lambda: "9.0")
    assert kc.key_components(_fake_plan(rhs=_closure_rhs(object())), names,
                                    example) is None


_KEY_SCRIPT = """
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
from solver import RODAS5P, CudaBackend
from solver.backends.cuda import kernel_cache
from solver.backends.cuda.codegen import KERNEL_ARGS
from solver.backends.cuda.plan import build_plan
from stiff_problems import ROBERTSON
kernel_cache.compute_capability = lambda: "9.0"
cfg = CudaBackend().ffi.config(ROBERTSON.rhs, 3, 3, False, 1e-6, np.full(3, 1e-9), np.ones(3),
                               1000, None, None, RODAS5P)
plan = build_plan(ROBERTSON.rhs, 3, 3, max_steps=1000)
ex = cfg.example(KERNEL_ARGS, (np.zeros(1),))
print("KEY", kernel_cache.cache_key(kernel_cache.key_components(plan, KERNEL_ARGS, ex)))
"""


def _child_env(**extra):
    """The environment of a child Python: the repository and the tests (stiff_problems) on
    the path."""
    path = [str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **extra)


def test_kernel_cache_key_is_stable_across_processes():
    import subprocess

    keys = []
    for seed in ("1", "2"):
        env = _child_env(PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu")
        out = subprocess.run([sys.executable, "-c", _KEY_SCRIPT], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        keys += [ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("KEY ")]
    assert len(keys) == 2 and keys[0] == keys[1]


def _entry_meta(name="_Z6kernelv", **kw):
    meta = {"func_name": name, "layout": [0, 0, 1, 0], "n_params": 8, "compile_seconds": 12.5,
            "local_mem_per_thread": 4096, "regs_per_thread": 96, "ptx_param_check": "no ptx",
            "versions": {"numba_cuda_mlir": "0.5.4"}}
    meta.update(kw)
    return meta


def test_kernel_cache_store_load_round_trip(kcache):
    from solver.backends.cuda.kernel_cache import CACHE_FORMAT

    key = "ab" * 32
    image = b"\x7fELF" + b"\0" * 16 + b"_Z6kernelv\0" + bytes(range(256))
    assert kcache.load(key) is None  # nothing yet: a silent miss
    js = kcache.store(key, image, _entry_meta())
    assert js == kcache.root / f"{key}.json"
    assert (kcache.root / f"{key}.cubin").read_bytes() == image
    assert not [p for p in kcache.root.iterdir() if p.suffix not in (".json", ".cubin")]
    got, meta = kcache.load(key, layout=np.array([0, 0, 1, 0]), n_params=8)
    assert got == image
    assert meta["func_name"] == "_Z6kernelv" and meta["image_bytes"] == len(image)
    assert meta["compile_seconds"] == 12.5 and meta["local_mem_per_thread"] == 4096
    assert meta["format"] == CACHE_FORMAT and meta["key"] == key and meta["created_at"]
    assert kcache.clear() == 2 and kcache.load(key) is None


@pytest.mark.parametrize("corruption", ["bad json", "size", "checksum", "entry name", "layout",
                                        "n_params", "format", "missing image"])
def test_kernel_cache_rejects_corrupt_entries(kcache, corruption):
    import hashlib
    import json

    from solver.backends.cuda.kernel_cache import CACHE_FORMAT

    key = "cd" * 32
    image = b"\x7fELF....._Z6kernelv\0...."
    js = kcache.store(key, image, _entry_meta())
    cubin = js.with_suffix(".cubin")
    meta = json.loads(js.read_text())
    layout, n_params = [0, 0, 1, 0], 8
    if corruption == "bad json":
        js.write_text("{not json")
    elif corruption == "size":
        cubin.write_bytes(image[:-3])
    elif corruption == "checksum":
        cubin.write_bytes(image[::-1])
    elif corruption == "entry name":
        other = image.replace(b"_Z6kernelv", b"_Z6othervv")
        cubin.write_bytes(other)
        meta["image_sha256"] = hashlib.sha256(other).hexdigest()
        js.write_text(json.dumps(meta))
    elif corruption == "layout":
        layout = [0, 1, 1, 0]
    elif corruption == "n_params":
        n_params = 9
    elif corruption == "format":
        meta["format"] = CACHE_FORMAT + 1
        js.write_text(json.dumps(meta))
    elif corruption == "missing image":
        cubin.unlink()
    with pytest.warns(RuntimeWarning, match="ignoring the kernel cache entry"):
        assert kcache.load(key, layout=np.array(layout), n_params=n_params) is None


class _FakeDispatcher:
    def get_local_mem_per_thread(self):
        return {("sig",): 2048}

    def get_regs_per_thread(self):
        return {("sig",): 80}


def _registration_setup(monkeypatch):
    """A real (host-side) plan and FFI configuration for Robertson; the device compile and the
    handler library replaced by recorders. ``fresh_config(cache)`` is a new process's
    configuration: a new launcher (no kernels registered yet) on the same kernel cache (or
    none); the plan itself is cached, host side only."""
    import itertools

    from solver.backends.cuda import ffi_kernel
    from solver.backends.cuda.launch_ffi import FfiLauncher
    from solver.backends.cuda.plan import Plan

    calls = {"kernel": 0, "compile": 0, "register": []}
    keys = itertools.count(1)

    def fake_kernel(self, module_dir=None):
        calls["kernel"] += 1
        return _FakeDispatcher()

    def fake_compile(disp, example):
        calls["compile"] += 1
        name = "_ZN8rodas_kernel6kernelE"
        return type("Res", (), {"metadata": {"cubin": b"\x7fELF" + name.encode() + b"\0cubin",
                                             "func_name": name, "ptx": ""}})()

    class Lib:
        @staticmethod
        def register_kernel(image, func_name):
            key = next(keys)
            calls["register"].append((key, bytes(image), func_name.encode()))
            return key

    monkeypatch.setattr(Plan, "kernel", fake_kernel)
    monkeypatch.setattr(ffi_kernel, "compile_result", fake_compile)

    def fresh_config(cache):
        return FfiLauncher(Lib, cache).config(ROBERTSON.rhs, 3, 3, False, 1e-6,
                                              np.full(3, 1e-9), np.ones(3), 1000, None, None,
                                              RODAS5P)

    return calls, fresh_config


def test_registration_takes_the_cache_branch_without_compiling(kcache, monkeypatch):
    from solver.backends.cuda import ffi_kernel

    calls, fresh_config = _registration_setup(monkeypatch)
    leaves = (jnp.zeros((1,)),)
    before = dict(kcache.stats)
    cfg1 = fresh_config(kcache)
    k1 = cfg1.kernel(leaves)
    assert calls["kernel"] == 1 and calls["compile"] == 1 and len(calls["register"]) == 1
    assert not k1.from_cache and k1.cache == "stored" and k1.dispatcher is not None
    assert k1.local_mem == 2048 and k1.regs == 80
    stored = json_entry = kcache.root / f"{k1.cache_key}.json"
    assert stored.is_file() and json_entry.with_suffix(".cubin").is_file()
    assert kcache.stats["stores"] == before["stores"] + 1
    assert cfg1.launcher.stats["kernels_registered"] == 1

    # "second process": the plan's compile is never reached
    def no_compile(*a, **k):
        raise AssertionError("compiled despite a valid cache entry")

    monkeypatch.setattr(ffi_kernel, "compile_result", no_compile)
    monkeypatch.setattr(type(k1.plan), "kernel", no_compile)
    cfg2 = fresh_config(kcache)
    k2 = cfg2.kernel(leaves)
    assert k2.from_cache and k2.cache == "hit" and k2.dispatcher is None
    assert k2.compile_s == 0.0 and k2.load_s >= 0.0 and k2.cached_compile_s == k1.compile_s
    assert (k2.func_name, k2.n_params, k2.image_bytes) == (k1.func_name, k1.n_params,
                                                           k1.image_bytes)
    assert k2.local_mem == 2048 and k2.regs == 80 and k2.cache_key == k1.cache_key
    np.testing.assert_array_equal(k2.layout, k1.layout)
    assert len(calls["register"]) == 2 and calls["register"][1][1:] == calls["register"][0][1:]
    assert calls["register"][1][0] != calls["register"][0][0]  # a new library key
    assert kcache.stats["hits"] == before["hits"] + 1
    assert cfg2.launcher.stats["kernels_registered"] == 1
    assert cfg2.launcher.stats["compile_seconds"] == 0.0

    # a corrupt entry: warned about, compiled again, overwritten; then a hit again
    json_entry.write_text("garbage")
    calls2, fresh_config = _registration_setup(monkeypatch)
    with pytest.warns(RuntimeWarning, match="ignoring the kernel cache entry"):
        k3 = fresh_config(kcache).kernel(leaves)
    assert calls2["compile"] == 1 and k3.cache == "stored" and not k3.from_cache
    assert fresh_config(kcache).kernel(leaves).from_cache and calls2["compile"] == 1


def test_kernel_cache_can_be_disabled(kcache, monkeypatch):
    """Without a kernel cache nothing is read or written; a cache that cannot be used (no
    compute capability) compiles and says so."""
    from solver.backends.cuda import kernel_cache

    calls, fresh_config = _registration_setup(monkeypatch)
    leaves = (jnp.zeros((1,)),)
    k = fresh_config(None).kernel(leaves)
    assert k.cache == "disabled" and k.cache_key is None and not k.from_cache
    assert not kcache.root.exists()  # nothing written
    assert fresh_config(kcache).kernel(leaves).cache == "stored"
    k = fresh_config(None).kernel(leaves)  # a valid entry exists: not read
    assert not k.from_cache and calls["compile"] == 3
    # the cache cannot be used (no compute capability): compiled, reported as unavailable
    monkeypatch.setattr(kernel_cache, "compute_capability", lambda: None)
    assert fresh_config(kcache).kernel(leaves).cache == "unavailable" and calls["compile"] == 4


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


_GPU_CACHE_SCRIPT = """
import json, sys
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
from solver import CudaBackend, solve
from stiff_problems import ROBERTSON, robertson_ensemble
y0, ts, params = robertson_ensemble(8, 10)
sol = solve(ROBERTSON.rhs, y0, ts, params, rtol=1e-6, atol=1e-12,
            backend=CudaBackend(launch="ffi", cache_root=sys.argv[2]))
np.savez(sys.argv[1], ys=np.asarray(sol.ys), t=np.asarray(sol.t_final), st=sol.status,
         nacc=sol.n_accepted, nrej=sol.n_rejected)
print("INFO " + json.dumps({k: v for k, v in sol.info.items()
                            if isinstance(v, (bool, int, float, str, type(None)))}))
"""


@pytest.mark.gpu
def test_kernel_cache_second_process_loads_instead_of_compiling(tmp_path):
    """Two fresh processes, one cache dir: the first compiles and stores the cubin, the second
    registers it without compiling, with identical results (and reports it in info)."""
    import json
    import subprocess

    # the children must not find the GPU preallocated by this process's JAX client
    env = _child_env(XLA_PYTHON_CLIENT_PREALLOCATE="false")
    infos, results = [], []
    for run in range(2):
        out_file = tmp_path / f"run{run}.npz"
        out = subprocess.run([sys.executable, "-c", _GPU_CACHE_SCRIPT, str(out_file),
                              str(tmp_path / "cache")],
                             capture_output=True, text=True, env=env, timeout=1800)
        assert out.returncode == 0, out.stdout + out.stderr
        info = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("INFO ")][-1][5:])
        print(f"process {run + 1}: kernel_cache={info['kernel_cache']} "
              f"kernel_seconds={info['kernel_seconds']:.3f} "
              f"compile_seconds={info['compile_seconds']:.3f} "
              f"kernel_load_seconds={info['kernel_load_seconds']:.4f}")
        infos.append(info)
        results.append(dict(np.load(out_file)))
    first, second = infos
    assert first["kernel_cache"] == "stored" and not first["kernel_from_cache"]
    assert first["first_call_includes_compile"] and first["compile_seconds"] > 0
    assert second["kernel_cache"] == "hit" and second["kernel_from_cache"]
    assert second["first_call_includes_kernel_load"] and not second["first_call_includes_compile"]
    assert second["compile_seconds"] == 0.0
    assert second["cached_compile_seconds"] == pytest.approx(first["compile_seconds"])
    assert second["kernel_cache_key"] == first["kernel_cache_key"]
    assert second["kernel_entry"] == first["kernel_entry"]
    assert second["cubin_bytes"] == first["cubin_bytes"]
    assert second["kernel_seconds"] < first["kernel_seconds"]
    assert np.all(results[0]["st"] == Status.OK)
    for name in ("ys", "t", "st", "nacc", "nrej"):
        np.testing.assert_array_equal(results[1][name], results[0][name], err_msg=name)


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
