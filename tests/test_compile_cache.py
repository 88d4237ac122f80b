"""The persistent compilation cache, as a user meets it: the main job in fresh processes.

Two processes started together on an empty cache (a sampler's workers) both finish and agree; a
later process loads every XLA program from the cache (none compiled) and writes identical files;
a changed precision (a different model structure) compiles its own programs instead of
loading stale ones; a corrupted cache is rebuilt. The counts come from the job's summary.json
(``compilation``: JAX's cache hit and miss events).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = """name: tiny
cosmology: {h: 0.6736, omega_b: 0.02237, omega_cdm: 0.12, A_s: 2.1e-9, n_s: 0.9649,
            tau_reio: 0.0544, N_ur: 3.044}
output: {z: [0.0], k_min: 0.001, k_max: 3.0, k_per_decade: 2}
precision: {l_max_g: %d, l_max_pol_g: 4, l_max_ur: 6, rtol: 1.0e-4, bg_n_lna: 400}
"""


def _start(tmp_path, name, cache, l_max_g=6, extra=()):
    config = tmp_path / f"{name}.yaml"
    config.write_text(TINY % l_max_g)
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "transfer.py"), "--config",
                             str(config), "--cache-dir", str(cache), "--out", str(out),
                             "--no-plot", "--backend", "jax", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items()
                                 if not k.startswith(("BOLTZMANN_", "XDG_CACHE"))})
    return proc, out


def _finish(started):
    proc, out = started
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    return summary["compilation"], (out / "pk.csv").read_text(), stderr


def _job(tmp_path, name, cache, l_max_g=6):
    return _finish(_start(tmp_path, name, cache, l_max_g))


@pytest.fixture(scope="module")
def cold_and_warm(tmp_path_factory):
    """Two cold processes writing the same empty cache at once, then a warm one."""
    tmp = tmp_path_factory.mktemp("cache")
    cache = tmp / "cache"
    first, second = _start(tmp, "cold", cache), _start(tmp, "cold_twin", cache)
    cold, twin = _finish(first), _finish(second)
    warm = _job(tmp, "warm", cache)
    return tmp, cache, cold, warm, twin


def _numbers(csv_text):
    return [line for line in csv_text.splitlines() if not line.startswith("#")]


def test_concurrent_writers_both_finish_and_agree(cold_and_warm):
    _, _, (_, pk_cold, _), _, (c_twin, pk_twin, _) = cold_and_warm
    assert c_twin["xla_programs_compiled"] + c_twin["xla_programs_loaded"] > 10
    assert _numbers(pk_twin) == _numbers(pk_cold)


def test_second_process_loads_everything_and_agrees(cold_and_warm):
    _, cache, (c_cold, pk_cold, err_cold), (c_warm, pk_warm, err_warm), (c_twin, _, _) = \
        cold_and_warm
    # the twin wrote at the same time: on a loaded machine one of the pair may load most of the
    # other's programs (39 compiled alone, 10 seen beside a busy test worker), so the pair
    # together filled the empty cache
    assert c_cold["xla_programs_compiled"] > 0 and c_cold["cache_dir"] == str(cache)
    assert c_cold["xla_programs_compiled"] + c_twin["xla_programs_compiled"] > 10
    assert c_warm["xla_programs_compiled"] == 0, c_warm
    assert c_warm["xla_programs_loaded"] >= c_cold["xla_programs_compiled"]
    assert _numbers(pk_warm) == _numbers(pk_cold)
    # the first run says why it waits; the later one has nothing to say
    assert "compiling the perturbation solver (first use" in err_cold
    assert "compiling" not in err_warm


@pytest.mark.slow  # a third cold compile of the tiny job (~20 s)
def test_changed_precision_does_not_load_stale_programs(cold_and_warm):
    tmp, cache, (_, pk_cold, _), _, _ = cold_and_warm
    changed, pk, _ = _job(tmp, "changed", cache, l_max_g=8)
    assert changed["xla_programs_compiled"] > 0
    assert _numbers(pk) != _numbers(pk_cold)          # the new hierarchy was solved


def test_corrupted_entries_are_rebuilt(cold_and_warm):
    tmp, cache, (_, pk_cold, _), _, _ = cold_and_warm
    entries = sorted((cache / "xla").glob("*-cache"), key=lambda p: p.stat().st_size)
    assert entries
    entries[-1].write_bytes(b"not an executable")     # the largest program: the solve loop
    rebuilt, pk, _ = _job(tmp, "rebuilt", cache)
    assert rebuilt["xla_programs_compiled"] == 1
    assert _numbers(pk) == _numbers(pk_cold)
    again, _, _ = _job(tmp, "again", cache)
    assert again["xla_programs_compiled"] == 0        # the rebuilt entries are good


def test_gradients_second_process_loads_everything_and_agrees(cold_and_warm, tmp_path):
    """``--gradients``: a later process loads the Jacobian's programs too (none compiled) —
    the solve program among them loaded ahead in a background thread while the main job runs
    (``PowerSpectrumFunction.preload``), which must find the executable the first process
    stored, not compile its own — and writes the same derivatives. The first process starts
    from a copy of the main job's cache (the fixture's), so it compiles only what
    ``--gradients`` adds."""
    cache = tmp_path / "cache"
    shutil.copytree(cold_and_warm[1], cache)
    cold, _, _ = _finish(_start(tmp_path, "cold", cache, extra=("--gradients",)))
    warm, _, _ = _finish(_start(tmp_path, "warm", cache, extra=("--gradients",)))
    assert cold["xla_programs_compiled"] > 3, cold
    assert warm["xla_programs_compiled"] == 0, warm
    assert _numbers((tmp_path / "warm" / "dpk.csv").read_text()) == \
        _numbers((tmp_path / "cold" / "dpk.csv").read_text())


def test_cache_can_be_cleared_and_turned_off(tmp_path):
    from boltzmann import runtime

    s = runtime.Settings.from_environment({"XDG_CACHE_HOME": str(tmp_path)})
    assert s.cache_root == tmp_path / "boltzmann-gpu"
    assert runtime.Settings.from_environment({"BOLTZMANN_CACHE": "0"}).cache_root is None
    assert runtime.Settings.from_environment({}, no_cache=True).cache_root is None
    moved = runtime.Settings.from_environment({"BOLTZMANN_CACHE_DIR": str(tmp_path / "c")})
    assert moved.cache_root == tmp_path / "c"
    (s.cache_root / "xla").mkdir(parents=True)
    (s.cache_root / "xla" / "entry").write_text("x")
    assert runtime.clear_cache(s) == [s.cache_root / "xla"]
    assert not (s.cache_root / "xla").exists()


def test_host_pool_default_follows_the_accelerator(monkeypatch):
    """Unset, BOLTZMANN_HOST_THREADS means one XLA:CPU thread where a GPU is visible (the host
    then runs only the sequential tables and inputs) and JAX's pool elsewhere; JAX_PLATFORMS=cpu
    or an empty CUDA_VISIBLE_DEVICES rule the GPU out, and 'all' asks for JAX's pool."""
    from boltzmann import runtime

    monkeypatch.setattr(runtime, "_gpu_device_nodes", lambda: ["/dev/nvidia0"])
    monkeypatch.setattr(runtime, "_gpu_plugin_installed", lambda: True)
    env = runtime.Settings.from_environment
    assert env({}).host_threads == runtime.ACCELERATOR_HOST_THREADS == 1
    assert env({"JAX_PLATFORMS": "cuda,cpu"}).host_threads == 1
    assert env({"JAX_PLATFORMS": "cpu"}).host_threads is None
    assert env({"CUDA_VISIBLE_DEVICES": ""}).host_threads is None
    assert env({"BOLTZMANN_HOST_THREADS": "all"}).host_threads == 0
    assert env({"BOLTZMANN_HOST_THREADS": "3"}).host_threads == 3
    monkeypatch.setattr(runtime, "_gpu_plugin_installed", lambda: False)
    assert env({}).host_threads is None
    monkeypatch.setattr(runtime, "_gpu_plugin_installed", lambda: True)
    monkeypatch.setattr(runtime, "_gpu_device_nodes", lambda: [])
    assert env({}).host_threads is None


def test_host_pool_sizing(tmp_path):
    """BOLTZMANN_HOST_THREADS: parsed (a bad value names what to give) and applied before JAX's
    backends exist — in a fresh process: XLA:CPU starts fewer threads, the process keeps its CPU
    affinity, and a later call changes nothing."""
    from boltzmann import runtime

    assert runtime.Settings.from_environment({"JAX_PLATFORMS": "cpu"}).host_threads is None
    assert runtime.Settings.from_environment({"BOLTZMANN_HOST_THREADS": "1"}).host_threads == 1
    assert runtime.Settings.from_environment({"BOLTZMANN_HOST_THREADS": "all"}).host_threads == 0
    with pytest.raises(ValueError, match="positive integer"):
        runtime.Settings.from_environment({"BOLTZMANN_HOST_THREADS": "many"})
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs and sched_setaffinity")
    child = (
        "import json, os, sys; from boltzmann import runtime; "
        "before = sorted(os.sched_getaffinity(0)); n = int(sys.argv[1]); "
        "sized = runtime.size_host_pool(n) if n else None; import jax; jax.devices(); "
        "print(json.dumps({'sized': sized, 'again': runtime.size_host_pool(1), "
        "'affinity_kept': sorted(os.sched_getaffinity(0)) == before, "
        "'threads': len(os.listdir('/proc/self/task'))}))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = {n: json.loads(subprocess.run([sys.executable, "-c", child, str(n)], env=env,
                                        capture_output=True, text=True, check=True,
                                        cwd=str(Path(__file__).parents[1])).stdout)
           for n in (0, 1)}
    assert out[1]["sized"] is True and out[1]["again"] is False
    assert out[1]["affinity_kept"] and out[0]["affinity_kept"]
    assert out[1]["threads"] < out[0]["threads"]
