"""Persisted traced programs (solver.persisted): a later process loads the exported program instead
of tracing it and computes the same bits; a changed program never loads a stale entry; a corrupt
entry is deleted and rebuilt; tracer arguments and unkeyable programs fall back to plain jit.
Small problems only (a two-component linear ODE), so the module stays fast on the CPU.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import solver
from solver import persisted
from solver.persisted import SUFFIX, PersistedProgram, set_program_store

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path):
    set_program_store(tmp_path / "exported")
    yield tmp_path / "exported"
    set_program_store(None)


def _entries(store):
    return sorted(store.glob(f"*{SUFFIX}")) if store.exists() else []


def _counting(fn):
    calls = []

    def wrapped(*args):
        calls.append(1)
        return fn(*args)
    return wrapped, calls


def _program(x, p):
    return {"y": jnp.sin(x) * p[0] + p[1], "s": (jnp.sum(x), x.shape[0])}


def test_a_new_instance_loads_without_tracing_and_agrees(store):
    x, p = jnp.linspace(0.0, 1.0, 7), (jnp.float64(2.0), 0.5)
    fn, calls = _counting(_program)
    first = PersistedProgram(fn, ("test", 1))(x, p)
    assert len(calls) == 1 and len(_entries(store)) == 1
    before = dict(persisted.STATS)
    fn2, calls2 = _counting(_program)        # as a later process would: nothing in memory
    again = PersistedProgram(fn2, ("test", 1))(x, p)
    assert calls2 == [] and persisted.STATS["loaded"] == before["loaded"] + 1
    plain = jax.jit(_program)(x, p)
    for a, b, c in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(again),
                       jax.tree_util.tree_leaves(plain)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes() == np.asarray(c).tobytes()
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(plain)


def test_stored_program_carries_no_locations(store):
    """The stored module has no source locations or op-name paths (XLA would keep them as
    per-instruction metadata that every later process re-reads), and still computes the same."""
    x, p = jnp.linspace(0.0, 1.0, 7), (jnp.float64(2.0), 0.5)
    PersistedProgram(_program, ("test", "locations"))(x, p)
    (entry,) = _entries(store)
    exported = jax.export.deserialize(persisted._read_entry(entry))
    text = exported.mlir_module()
    assert "stablehlo.sine" in text
    assert "test_persisted_programs.py" not in text and "_program" not in text
    traced = jax.export.export(jax.jit(_program))(x, p).mlir_module()
    assert "test_persisted_programs.py" in traced          # what stripping removed
    again = PersistedProgram(_program, ("test", "locations"))(x, p)
    assert np.asarray(again["y"]).tobytes() == np.asarray(jax.jit(_program)(x, p)["y"]).tobytes()


def test_release_drops_the_program_and_the_next_call_loads_it_again(store):
    x, p = jnp.linspace(0.0, 1.0, 7), (jnp.float64(2.0), 0.5)
    fn, calls = _counting(_program)
    program = PersistedProgram(fn, ("test", "release"))
    first = program(x, p)
    other = jax.jit(lambda v: 2.0 * v)
    other(x)
    assert program._programs and other._cache_size() == 1
    program.release()
    assert not program._programs and other._cache_size() == 0     # every jit cache dropped
    before = dict(persisted.STATS)
    again = program(x, p)                        # from the store, not traced again
    assert len(calls) == 1 and persisted.STATS["loaded"] == before["loaded"] + 1
    for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_load_in_a_background_thread_makes_the_call_run_the_loaded_executable(store):
    """``load`` (what ``PowerSpectrumFunction.preload`` runs in a thread) readies a stored program
    from shape structs alone; the call then runs that executable (no trace, no second load) and
    agrees bit for bit. With nothing stored it does nothing and says so, and the stored outputs'
    shapes come from the store without tracing."""
    import threading

    x, p = jnp.linspace(0.0, 1.0, 7), (jnp.float64(2.0), 0.5)
    avals = jax.tree_util.tree_map(jax.typeof, (x, p))      # 0.5 stays weakly typed
    shapes = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type), avals)
    fresh, calls = _counting(_program)
    assert not PersistedProgram(fresh, ("test", 4)).has_stored(*shapes)
    assert PersistedProgram(fresh, ("test", 4)).load(*shapes) is False
    assert calls == [] and _entries(store) == []            # nothing traced, nothing written
    first = PersistedProgram(_program, ("test", 4))(x, p)

    later, calls = _counting(_program)                       # as a later process would
    program = PersistedProgram(later, ("test", 4))
    assert program.has_stored(*shapes)
    out = program.stored_output_shapes(x, p)
    assert out["y"].shape == (7,) and out["y"].dtype == jnp.float64 and calls == []
    loaded = []
    thread = threading.Thread(target=lambda: loaded.append(program.load(*shapes)))
    thread.start()
    again = program(x, p)                                    # waits for the load, never repeats it
    thread.join()
    assert loaded == [True] and calls == []
    assert any(isinstance(v, jax.stages.Compiled) for v in program._programs.values())
    for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(again)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_load_with_build_traces_stores_and_compiles_a_missing_program(store):
    """``load(build=True)`` (what ``preload`` runs in a first process on a GPU machine) traces a
    program the store lacks once, stores it and compiles it; the call then runs that executable
    without tracing again, bit for bit as plain jit, and a later instance loads the entry. Where
    nothing can be persisted (no store) it does nothing and says so."""
    import threading

    x, p = jnp.linspace(0.0, 1.0, 7), (jnp.float64(2.0), 0.5)
    fn, calls = _counting(_program)
    program = PersistedProgram(fn, ("test", "build"))
    built = []
    thread = threading.Thread(target=lambda: built.append(program.load(x, p, build=True)))
    thread.start()
    thread.join()
    assert built == [True] and len(calls) == 1 and len(_entries(store)) == 1
    assert any(isinstance(v, jax.stages.Compiled) for v in program._programs.values())
    out = program(x, p)
    assert len(calls) == 1                                   # the call traced nothing
    assert program.load(x, p, build=True) is True and len(calls) == 1
    plain = jax.jit(_program)(x, p)
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(plain)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    later, calls_later = _counting(_program)
    before = dict(persisted.STATS)
    assert PersistedProgram(later, ("test", "build")).load(x, p, build=True) is True
    assert calls_later == [] and persisted.STATS["loaded"] == before["loaded"] + 1
    set_program_store(None)
    assert PersistedProgram(_program, ("test", "build")).load(x, p, build=True) is False


def test_lower_bypasses_the_store(store):
    """``lower`` gives the plain jit's lowering (for measuring a program): it writes nothing,
    and the compiled program computes what the program does."""
    x, p = jnp.linspace(0.0, 1.0, 7), (jnp.float64(2.0), 0.5)
    program = PersistedProgram(_program, ("test", "lower"))
    lowered = program.lower(jax.ShapeDtypeStruct(x.shape, x.dtype), p)
    assert "stablehlo.sine" in lowered.as_text() and _entries(store) == []
    got = lowered.compile()(x, p)
    np.testing.assert_array_equal(np.asarray(got["y"]), np.asarray(_program(x, p)["y"]))


def test_changed_key_or_signature_writes_a_new_entry(store):
    x = jnp.linspace(0.0, 1.0, 7)
    PersistedProgram(lambda a: a * 2.0, ("double",))(x)
    out = PersistedProgram(lambda a: a * 3.0, ("triple",))(x)
    assert len(_entries(store)) == 2 and np.allclose(out, 3.0 * x)
    PersistedProgram(lambda a: a * 3.0, ("triple",))(jnp.linspace(0.0, 1.0, 8))  # new shape
    PersistedProgram(lambda a: a * 3.0, ("triple",))(jnp.linspace(0.0, 1.0, 8, dtype=jnp.float32))
    assert len(_entries(store)) == 4


@pytest.mark.parametrize("damage", ["truncate", "garbage", "bad_payload"])
def test_corrupt_entry_is_deleted_and_rebuilt(store, damage):
    x = jnp.linspace(0.0, 1.0, 5)
    PersistedProgram(lambda a: jnp.cos(a), ("cos",))(x)
    (entry,) = _entries(store)
    data = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        entry.write_bytes(b"not an exported program")
    else:   # a well-formed file whose payload does not deserialize
        import hashlib
        payload = b"\x00" * 64
        entry.write_bytes(persisted.MAGIC + hashlib.sha256(payload).hexdigest().encode()
                          + b"\n" + payload)
    before = dict(persisted.STATS)
    fn, calls = _counting(lambda a: jnp.cos(a))
    out = PersistedProgram(fn, ("cos",))(x)
    assert calls == [1]                                   # traced again
    assert persisted.STATS["corrupt"] == before["corrupt"] + 1
    assert persisted.STATS["exported"] == before["exported"] + 1
    assert np.asarray(out).tobytes() == np.asarray(jnp.cos(x)).tobytes()
    fn2, calls2 = _counting(lambda a: jnp.cos(a))
    PersistedProgram(fn2, ("cos",))(x)                    # the rebuilt entry is good
    assert calls2 == []


def test_tracer_arguments_fall_back_to_plain_jit(store):
    prog = PersistedProgram(lambda a: jnp.sum(jnp.sin(a) ** 2), ("sq",))
    x = jnp.linspace(0.0, 1.0, 5)
    g = jax.grad(prog)(x)
    v = jax.jit(lambda a: prog(a) * 2.0)(x)
    assert _entries(store) == []
    assert np.allclose(g, 2 * jnp.sin(x) * jnp.cos(x)) and np.isclose(v, 2 * jnp.sum(jnp.sin(x) ** 2))


def test_no_store_or_no_key_is_plain_jit(tmp_path):
    x = jnp.ones(3)
    assert persisted.program_store() is None
    assert np.allclose(PersistedProgram(lambda a: a + 1, ("p",))(x), 2.0)

    from solver.digest import Unfingerprintable

    def no_key():
        raise Unfingerprintable("test")
    set_program_store(tmp_path / "s")
    try:
        assert np.allclose(PersistedProgram(lambda a: a + 1, no_key)(x), 2.0)
        assert _entries(tmp_path / "s") == []
    finally:
        set_program_store(None)


def test_fingerprint_describes_namespaces():
    from types import SimpleNamespace

    from solver.backends.cuda.fingerprint import fingerprint as cuda_fingerprint
    from solver.digest import digest_of, fingerprint
    assert cuda_fingerprint is fingerprint
    a = SimpleNamespace(f=math.sin, k=1.0)
    assert digest_of(a) == digest_of(SimpleNamespace(f=math.sin, k=1.0))
    assert digest_of(a) != digest_of(SimpleNamespace(f=math.sin, k=2.0))


def test_eb_rhs_is_fingerprintable():
    from models.eb import build_eb_model
    from solver.digest import digest_of
    m = build_eb_model(l_max_g=6, l_max_pol_g=4, l_max_ur=6)
    assert digest_of(m.rhs) == digest_of(m.rhs)
    assert digest_of(m.rhs) != digest_of(build_eb_model(l_max_g=8, l_max_pol_g=4,
                                                        l_max_ur=6).rhs)


_SCRIPT = r"""
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import solver
from solver import persisted
solver.set_program_store(sys.argv[1])
rate, max_steps = float(sys.argv[2]), int(sys.argv[3])
def rhs(y, t, p):
    return (-RATE * p[0] * y[0] + y[1], -p[1] * y[1])
RATE = rate
y0 = np.ones((3, 2)); p = np.array([[1.0, 2.0], [3.0, 0.5], [2.0, 2.0]])
sol = solver.solve(rhs, y0, np.linspace(0.0, 1.0, 5), p, max_steps=max_steps)
print(json.dumps({"stats": persisted.STATS, "ys": np.asarray(sol.ys).tobytes().hex()}))
"""


RATE = 1.0


def _rhs(y, t, p):
    return (-RATE * p[0] * y[0] + y[1], -p[1] * y[1])


def _process(store, rate=1.0, max_steps=1000):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOLTZMANN_", "XDG_CACHE"))}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(store), str(rate), str(max_steps)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_solve_program_persists_across_processes(tmp_path):
    store = tmp_path / "exported"
    cold = _process(store)
    assert cold["stats"]["exported"] == 1 and cold["stats"]["loaded"] == 0
    warm = _process(store)
    assert warm["stats"]["exported"] == 0 and warm["stats"]["loaded"] == 1
    assert warm["ys"] == cold["ys"]
    # plain jit (no store) in this process computes the same bits
    assert persisted.program_store() is None
    sol = solver.solve(_rhs, np.ones((3, 2)), np.linspace(0.0, 1.0, 5),
                       np.array([[1.0, 2.0], [3.0, 0.5], [2.0, 2.0]]), max_steps=1000)
    assert np.asarray(sol.ys).tobytes().hex() == cold["ys"]
    assert len(_entries(store)) == 1
    # a different rhs (same shapes) and a different max_steps: their own entries, never the
    # stale one
    other = _process(store, rate=2.0)
    assert other["stats"]["exported"] == 1 and other["ys"] != cold["ys"]
    steps = _process(store, max_steps=500)
    assert steps["stats"]["exported"] == 1 and steps["ys"] == cold["ys"]
    assert len(_entries(store)) == 3


def test_configure_sets_the_store_and_clear_cache_removes_it(tmp_path, monkeypatch):
    from boltzmann import runtime

    # keep this session's XLA cache settings (conftest) as they are
    monkeypatch.setattr(jax.config, "update", lambda *a, **k: None)
    monkeypatch.setattr(runtime, "_configured_root", None)
    settings = runtime.Settings(cache_root=tmp_path / "root")
    try:
        runtime.configure(settings)
        assert persisted.program_store() == tmp_path / "root" / runtime.EXPORTED_DIR
        PersistedProgram(lambda a: a - 1.0, ("configured",))(jnp.ones(2))
        assert len(_entries(persisted.program_store())) == 1
        assert tmp_path / "root" / "exported" in runtime.clear_cache(settings)
        assert not (tmp_path / "root" / "exported").exists()
        runtime.configure(runtime.Settings(cache_root=None))
        assert persisted.program_store() is None
    finally:
        set_program_store(None)


def test_export_platform_names():
    # a GPU device says "gpu"; jax.export only runs a program exported for "cuda" / "rocm" there
    from solver.persisted import export_platform_name
    assert export_platform_name("gpu", "cuda 13.0 (driver 580)") == "cuda"
    assert export_platform_name("gpu", "ROCm 6.2") == "rocm"
    assert export_platform_name("gpu") == "cuda"
    assert export_platform_name("cpu") == "cpu"
