"""The CUDA backend's on-disk kernel cache (solver/backends/cuda/kernel_cache.py), as the XLA FFI
launch uses it.

CPU: the key covers each component (kernel source, device functions, versions, compute
capability, argument types) and is stable across processes; entries round-trip, corrupt ones are
rejected; registration takes the cache branch without compiling (the compile mocked); the cache
can be disabled.

GPU (``-m gpu``): a second process loads the first one's cubin from the kernel cache instead of
compiling it, with identical results.
"""
import os
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from solver import RODAS5P, Status
from stiff_problems import ROBERTSON, VAN_DER_POL

TESTS = Path(__file__).resolve().parent


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
