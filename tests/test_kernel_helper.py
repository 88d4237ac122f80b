"""The helper process that compiles the Jacobian's CUDA sensitivity kernel beside the main job
(boltzmann/kernel_helper.py, its process boltzmann/kernel_helper_run.py): where it starts, what it rebuilds, its marker, lock and failure
handling. The kernel itself compiles on the GPU only (tests/test_cuda_sens_cache.py)."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

from boltzmann import kernel_helper, kernel_helper_run
from boltzmann.gradients import PowerSpectrumFunction, available_parameters
from boltzmann.params import load_config
from solver import CudaBackend


def _function(backend, **kw):
    cfg = load_config("lcdm_reduced")
    kw.setdefault("parameters", ("h", "omega_cdm"))
    return PowerSpectrumFunction(cfg, backend=backend, k=np.array([0.01, 0.1]), z=[0.0],
                                 with_sigma8=False, **kw)


def test_no_helper_where_it_cannot_pay(tmp_path):
    """The JAX backend, the emulated kernels and a CUDA backend without a kernel cache (nothing
    a helper could hand over) start no process."""
    for backend in ("jax", CudaBackend(launch="emulated", cache_root=tmp_path), CudaBackend()):
        assert kernel_helper.start(_function(backend)) is None
    assert not (tmp_path / kernel_helper.HELPERS_DIR).exists()


def test_construction_kwargs_rebuild_the_same_function():
    """What the helper rebuilds from ``construction_kwargs`` on its own backend object is the
    caller's function (same construction, same key); another tolerance is another key."""
    fn = _function(CudaBackend(launch="emulated"), rtol=1e-5)
    again = PowerSpectrumFunction(fn.config, backend=CudaBackend(launch="emulated"),
                                  **fn.construction_kwargs)
    assert again._construction == fn._construction
    assert kernel_helper.helper_key(again) == kernel_helper.helper_key(fn)
    assert kernel_helper.helper_key(_function(CudaBackend(launch="emulated"), rtol=2e-5)) != \
        kernel_helper.helper_key(fn)
    assert kernel_helper.helper_key(_function(CudaBackend(launch="emulated", kernel="thread"),
                                              rtol=1e-5)) != kernel_helper.helper_key(fn)


def _spec(tmp_path, fn, backend_root):
    marker = backend_root / kernel_helper.HELPERS_DIR / "k.json"
    spec = tmp_path / "k.spec"
    spec.write_bytes(pickle.dumps({
        "config": fn.config, "kwargs": fn.construction_kwargs, "theta": np.asarray(fn.theta0),
        "backend": {"launch": "emulated", "cache_root": backend_root, "kernel": "auto"},
        "cache_root": None, "marker": marker, "key": kernel_helper.helper_key(fn)}))
    return spec, marker


def test_main_writes_the_marker_and_a_stored_kernel_stops_later_helpers(tmp_path, monkeypatch):
    """``kernel_helper_run.main`` compiles through ``warm_sensitivity_kernel`` and writes a marker naming the
    kernel-cache entry; once that entry's files exist, ``start`` starts nothing and a helper
    that finds the marker after waiting for the lock compiles nothing."""
    root = tmp_path / "cuda"
    fn = _function(CudaBackend(launch="emulated", cache_root=root))
    spec, marker = _spec(tmp_path, fn, root)
    calls = []

    def fake_warm(self, theta=None):
        calls.append(np.asarray(theta))
        return {"kernel_cache_key": "0123abcd", "compile_seconds": 1.5, "kernel_from_cache": False}

    monkeypatch.setattr(PowerSpectrumFunction, "warm_sensitivity_kernel", fake_warm)
    assert kernel_helper_run.main([str(spec)]) == 0
    assert len(calls) == 1 and np.array_equal(calls[0], np.asarray(fn.theta0))
    written = json.loads(marker.read_text())
    assert written["kernel_cache_key"] == "0123abcd"
    # the phases of the helper's time, for the caller's report (spec without "started_at":
    # counted from the helper's own start)
    assert set(written["timeline"]) == {"imports_s", "lock_s", "build_s", "warm_s", "inputs_s",
                                        "total_s"}
    assert written["timeline"]["total_s"] >= written["timeline"]["build_s"] >= 0
    cache = CudaBackend(launch="numba", cache_root=root).kernel_cache
    assert not kernel_helper.kernel_stored(marker, cache)        # the entry is not there yet
    for path in cache.paths("0123abcd"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"entry")
    assert kernel_helper.kernel_stored(marker, cache)
    assert kernel_helper_run.main([str(spec)]) == 0 and len(calls) == 1   # found, not compiled
    monkeypatch.setattr(kernel_helper, "_usable", lambda backend: True)
    real = _function(CudaBackend(launch="numba", cache_root=root))
    monkeypatch.setattr(kernel_helper, "helper_key", lambda f: "k")
    assert kernel_helper.start(real) is None


def test_main_refuses_a_spec_of_another_function(tmp_path, monkeypatch):
    """A spec whose key is not the rebuilt function's (another code or construction) compiles
    nothing and fails, so the caller compiles its own kernel."""
    root = tmp_path / "cuda"
    fn = _function(CudaBackend(launch="emulated", cache_root=root))
    spec, marker = _spec(tmp_path, fn, root)
    data = pickle.loads(spec.read_bytes())
    data["key"] = "0" * 64
    spec.write_bytes(pickle.dumps(data))
    monkeypatch.setattr(PowerSpectrumFunction, "warm_sensitivity_kernel",
                        lambda self, theta=None: pytest.fail("compiled for another function"))
    assert kernel_helper_run.main([str(spec)]) == 1
    assert not marker.exists()


def _helper(tmp_path, code):
    log_path, spec = tmp_path / "h.log", tmp_path / "h.spec"
    spec.write_bytes(b"spec")
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out,
                                stderr=subprocess.STDOUT)
    return kernel_helper.KernelHelper(proc, spec, log_path), spec, log_path


def test_wait_reports_success_failure_and_a_helper_that_hangs(tmp_path):
    """``wait``: True for a helper that exits 0 (its spec and log removed); False with a warning
    that quotes the end of its log for one that fails; one that outlives the limit is stopped."""
    ok, spec, log_path = _helper(tmp_path, "print('done')")
    ok.marker_path = tmp_path / "h.json"
    ok.marker_path.write_text(json.dumps({"kernel_cache_key": "ab", "timeline": {"total_s": 2.0}}))
    assert ok.wait(60) is True and ok.wait() is True
    assert ok.timeline == {"total_s": 2.0}             # read from the marker it wrote
    assert not spec.exists() and not log_path.exists()
    bad, spec, log_path = _helper(tmp_path, "import sys; print('no GPU here'); sys.exit(3)")
    with pytest.warns(RuntimeWarning, match="(?s)exited with status 3.*no GPU here"):
        assert bad.wait(60) is False
    assert not spec.exists() and log_path.exists()
    slow, _, _ = _helper(tmp_path, "import time; time.sleep(60)")
    with pytest.warns(RuntimeWarning, match="did not finish in 1 s"):
        assert slow.wait(1.0) is False
    assert slow.process.poll() is not None


@pytest.mark.slow  # ~70 s on 2 cores: the inputs program's compile and the emulated kernel
def test_warm_sensitivity_kernel_launches_the_jacobians_kernel():
    """``warm_sensitivity_kernel`` runs the Jacobian's sensitivity launch (the warp kernel, every
    solve direction: all parameters but the primordial ones) on one mode: here through the
    emulated kernel."""
    cfg = load_config("lcdm_reduced")
    params = available_parameters(cfg.cosmology)
    fn = PowerSpectrumFunction(cfg, parameters=params, backend=CudaBackend(launch="emulated"),
                               k=np.array([0.001, 0.01, 0.1]), z=[0.0], with_sigma8=False)
    info = fn.warm_sensitivity_kernel()
    m = len(fn.solve_directions)
    assert m == len(params) - 2 and info["directions"] == m and info["kernel"] == "warp"
    assert info["threads"] == 32 * m                 # one mode: a warp per direction


@pytest.mark.gpu
def test_helper_compiles_the_kernel_the_jacobian_loads(tmp_path):
    """On a GPU, with an empty kernel cache: ``preload`` starts the helper, ``jacobian`` waits
    for it and loads the sensitivity kernel it stored (no compile in this process), and a second
    function built alike starts no helper (the marker names a stored kernel)."""
    cfg = load_config("lcdm_reduced")
    params = available_parameters(cfg.cosmology)
    root = tmp_path / "cuda"

    def build():
        return PowerSpectrumFunction(cfg, parameters=params, backend=CudaBackend(cache_root=root),
                                     k=np.logspace(-3.0, 0.0, 12) * float(cfg.cosmology.h),
                                     z=[0.0], n_chunks=1, with_sigma8=False)

    fn = build()
    fn.preload()
    assert fn._kernel_helper is not None
    out = fn.dlnpk()
    assert fn.last_kernel_helper["succeeded"], fn.last_kernel_helper
    info = fn.backend.last_sensitivity_info
    assert info["kernel_from_cache"] is True and info["compile_seconds"] == 0.0, info
    assert np.all(np.isfinite(out["dlnP_m"]))
    marker = json.loads(next((root / kernel_helper.HELPERS_DIR).glob("*.json")).read_text())
    assert marker["kernel_cache_key"] == info["kernel_cache_key"]
    assert kernel_helper.start(build()) is None
