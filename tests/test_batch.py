"""Batch mode (boltzmann.batch, scripts/batch.py): the HDF5 contract, resuming bit for bit, a
killed run losing at most one chunk, refusal of a mismatched config or table, failing rows
recorded while the others are computed, clear messages for bad input, device threads, the
progress line, and Dask.

Most tests run the batch machinery around a stand-in for ``run_ensemble`` (``fake_ensemble``:
deterministic numbers from the parameters, with triggers for every kind of failure), which costs
no compilation; the tests marked "real" run the physics on a tiny config (6 k values up to
0.5 h/Mpc, ℓmax 4), compiled once for the module. The heavier ones — Dask workers compiling the
physics, two host devices in a subprocess, the command killed for real — are marked slow.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import h5py
import jax
import numpy as np
import pytest

from boltzmann import ensemble
from boltzmann.batch import BatchError, run_batch
from boltzmann.batch import cli as batch_cli
from boltzmann.batch.executors import LocalExecutor, resolve_devices
from boltzmann.batch.progress import BatchProgress, format_duration
from boltzmann.batch.store import ERROR, INVALID, NONFINITE, OK, PENDING, SOLVER, read_messages
from boltzmann.batch.table import row_cosmology, base_block
from boltzmann.params import load_config

REPO = Path(__file__).resolve().parents[1]
TINY = {"name": "tiny",
        "cosmology": {"h": 0.67, "omega_b": 0.0224, "omega_cdm": 0.12, "ln10^{10}A_s": 3.044,
                      "n_s": 0.965, "tau_reio": 0.054},
        "output": {"z": [0.0, 1.0], "k_min": 1e-3, "k_max": 0.5, "k_per_decade": 1.85},
        "precision": {"l_max_g": 4, "l_max_pol_g": 4, "l_max_ur": 4, "l_max_ncdm": 4,
                      "n_q_ncdm": 1, "bg_n_lna": 300, "rtol": 1e-4}}
DATASETS = ("k", "pk_m", "pk_cb", "sigma8", "sigma8_cb", "derived/z_reio", "derived/z_rec",
            "derived/z_star", "derived/z_drag", "status", "message", "params")

#: launches of the stand-in in this process: (cosmologies, structure)
LAUNCHES = []
RAISE = {"on": True}


def fake_ensemble(cosmos, precision, output, backend="auto"):
    """``run_ensemble``'s result shape from a formula. Triggers: h >= 0.75 fails a mode,
    omega_cdm = 0.13 gives a NaN P(k), n_s = 0.99 raises (while ``RAISE['on']``)."""
    ensemble.check_structure(cosmos)
    LAUNCHES.append((len(cosmos), (cosmos[0].n_ncdm, bool(cosmos[0].use_fld))))
    if RAISE["on"] and any(float(c.n_s) == 0.99 for c in cosmos):
        raise RuntimeError("simulated out of memory")
    z = np.asarray(output.z)
    h = np.array([float(c.h) for c in cosmos])
    k = np.stack([output.k_grid(x) for x in h])
    amp = np.array([float(c.A_s) * float(c.omega_cdm) for c in cosmos]) * 1e12
    ns = np.array([float(c.n_s) for c in cosmos])
    pk = amp[:, None, None] * k[:, None, :] ** (ns[:, None, None] - 4) / (1 + z[None, :, None])
    pk[np.array([float(c.omega_cdm) == 0.13 for c in cosmos]), 0, 0] = np.nan
    ok = h < 0.75
    spectra = types.SimpleNamespace(z=tuple(output.z), pk_m=pk, pk_cb=0.9 * pk,
                                    sigma8=np.outer(h, 1 + z), sigma8_cb=np.outer(h, 1 - z / 4),
                                    problems=[])
    tables = types.SimpleNamespace(derived={n: (i + 1) * 100 * h for i, n in
                                            enumerate(("z_reio", "z_rec", "z_star", "z_drag"))})
    failures = [(c, float(k[c, 0]), "maximum number of steps") for c in range(len(cosmos))
                if not ok[c]]
    # transfers on their own (solved) wavenumbers, as run_ensemble's: here every mode
    return types.SimpleNamespace(k=k, ok=lambda: ok, failures=lambda: failures, spectra=spectra,
                                 tables=tables, transfers=types.SimpleNamespace(k=k),
                                 backend="fake")


def slow_fake(*args, **kwargs):
    time.sleep(float(os.environ.get("BATCH_TEST_SLEEP", "0")))
    return fake_ensemble(*args, **kwargs)


def write_csv(path, header, rows):
    lines = [",".join(header)] + [",".join("" if v is None else str(v) for v in r) for r in rows]
    Path(path).write_text("\n".join(lines) + "\n")
    return path


def read_all(path) -> dict:
    with h5py.File(path, "r") as f:
        out = {name: f[name][...] for name in DATASETS}
        out["attrs"] = dict(f.attrs)
        out["z"] = f["z"][...]
    return out


def assert_same_file(a, b):
    fa, fb = read_all(a), read_all(b)
    for name in DATASETS + ("z",):
        np.testing.assert_array_equal(fa[name], fb[name], err_msg=name)


def quiet():
    return BatchProgress(0, enabled=False)


#: a table with every kind of row: ok, fluid and massive-neutrino groups, a mode failure, a NaN,
#: an unreadable cell, a wrong cell count, a validation failure
MIXED_HEADER = ("h", "omega_cdm", "A_s", "n_s", "m_ncdm", "w0_fld")
MIXED_ROWS = [
    (0.67, 0.12, None, None, None, None),      # 0 ok
    (0.70, 0.11, 2.0e-9, None, None, -0.9),    # 1 fluid group
    (0.80, 0.12, None, None, None, None),      # 2 solver failure (h >= 0.75)
    ("abc", 0.12, None, None, None, None),     # 3 unreadable cell
    (0.68, 0.13, None, None, None, None),      # 4 NaN P(k)
    (5.0, 0.12, None, None, None, None),       # 5 out of range
    (0.69, 0.12, None, None, 0.06, None),      # 6 one massive species group
    (0.66, 0.121, None, 0.97, None, None),     # 7 ok
    (0.71, 0.119, None, None, None, -0.8),     # 8 fluid group
]


@pytest.fixture
def mixed(tmp_path):
    path = write_csv(tmp_path / "params.csv", MIXED_HEADER, MIXED_ROWS)
    with open(path, "a") as fh:
        fh.write("0.7,0.12\n")                  # 9 wrong cell count
    return path


# =========================================================================== the contract
def test_hdf5_contract(tmp_path, mixed):
    LAUNCHES.clear()
    out = tmp_path / "out.h5"
    summary = run_batch(TINY, mixed, out, chunk_size=2, ensemble=fake_ensemble, progress=quiet())
    f = read_all(out)
    N, Z, K = 10, 2, len(load_config(TINY).output.k_grid(1.0))
    assert f["params"].shape == (N, 6) and f["k"].shape == (N, K)
    assert f["pk_m"].shape == f["pk_cb"].shape == (N, Z, K) and f["sigma8"].shape == (N, Z)
    assert f["status"].dtype == np.int8 and f["derived/z_rec"].shape == (N,)
    np.testing.assert_array_equal(f["z"], [0.0, 1.0])
    with h5py.File(out) as h5:
        assert json.loads(h5["params"].attrs["names"]) == list(MIXED_HEADER)
    np.testing.assert_array_equal(f["params"][0], [0.67, 0.12] + [np.nan] * 4)
    attrs = f["attrs"]
    assert attrs["format"] == "boltzmann-batch 1" and len(attrs["config_hash"]) == 64
    assert "boltzmann-gpu" in attrs["code_version"] and "precision:" in attrs["config"]
    assert json.loads(attrs["backends"]) == ["fake"] and int(attrs["chunk_size"]) == 2
    assert set(json.loads(attrs["status_codes"])) == {"-1", "0", "1", "2", "3", "4"}

    status = f["status"].tolist()
    assert status == [OK, OK, SOLVER, INVALID, NONFINITE, INVALID, OK, OK, OK, INVALID]
    msg = [m.decode() for m in f["message"]]
    assert msg[0] == "" and "maximum number of steps" in msg[2]
    assert "line 5" in msg[3] and "'abc' is not a number" in msg[3]
    assert "non-finite pk_m" in msg[4] and "cosmology.h = 5.0 is out of range" in msg[5]
    assert "2 cells" in msg[9] and "header has 6" in msg[9]
    ok = f["status"] == OK
    for name in ("k", "pk_m", "pk_cb", "sigma8", "sigma8_cb", "derived/z_reio"):
        assert np.all(np.isfinite(f[name][ok])), name
        assert np.all(np.isnan(f[name][~ok])), f"{name}: a failed row must hold no numbers"
    # grouped by structure; every launch of a group has the group's size
    assert sorted(LAUNCHES) == sorted([(2, (0, False))] * 3 + [(2, (0, True)), (1, (1, False))])
    # the values are the row's own: P(k) follows the row's A_s and h
    c = row_cosmology(base_block(load_config(TINY).cosmology), MIXED_HEADER,
                      np.array([0.70, 0.11, 2.0e-9, np.nan, np.nan, -0.9]))
    np.testing.assert_array_equal(f["pk_m"][1], fake_ensemble([c], None, load_config(TINY).output)
                                  .spectra.pk_m[0])
    assert summary.n_ok == 5 and summary.n_failed == 5 and summary.n_left == 0


def test_resume_equals_uninterrupted_and_computes_only_the_rest(tmp_path, mixed):
    whole = tmp_path / "whole.h5"
    run_batch(TINY, mixed, whole, chunk_size=2, ensemble=fake_ensemble, progress=quiet())
    part = tmp_path / "part.h5"

    def stop(result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_batch(TINY, mixed, part, chunk_size=2, ensemble=fake_ensemble, on_chunk=stop,
                  progress=quiet())
    with h5py.File(part) as h5:
        done = int(np.sum(h5["status"][...] != PENDING))
    assert 0 < done < 10
    for thread in threading.enumerate():   # a launch in flight at the interrupt finishes (unused)
        if thread.name.startswith("batch-"):
            thread.join()
    LAUNCHES.clear()
    summary = run_batch(TINY, mixed, part, ensemble=fake_ensemble, progress=quiet())
    assert summary.computed == 10 - done and len(LAUNCHES) == 5 - 1
    assert_same_file(whole, part)
    again = run_batch(TINY, mixed, part, ensemble=fake_ensemble, progress=quiet())
    assert again.computed == 0 and again.chunks == 0


KILL_SCRIPT = """
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
import jax
jax.config.update("jax_enable_x64", True)
import test_batch as tb
from boltzmann.batch import run_batch
run_batch(tb.TINY, {csv!r}, {out!r}, chunk_size=2, ensemble=tb.slow_fake, progress=tb.quiet(),
          on_chunk=lambda r: print("written", len(r.rows), flush=True))
"""


def test_killed_run_loses_at_most_one_chunk(tmp_path):
    rows = [(0.60 + 0.01 * i, 0.11 + 0.001 * i) for i in range(12)]
    csv = write_csv(tmp_path / "p.csv", ("h", "omega_cdm"), rows)
    out = tmp_path / "killed.h5"
    code = KILL_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), csv=str(csv),
                              out=str(out))
    env = {**os.environ, "BATCH_TEST_SLEEP": "0.5"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)
    reported = 0
    try:
        for line in proc.stdout:
            reported += int(line.split()[1])
            if reported >= 4:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert reported >= 4, "the batch died before writing two chunks"
    with h5py.File(out) as h5:
        status = h5["status"][...]
        pk = h5["pk_m"][...]
    done = status != PENDING
    assert done.sum() >= reported and done.sum() < 12
    assert np.all(np.isfinite(pk[done])) and np.all(np.isnan(pk[~done]))
    summary = run_batch(TINY, csv, out, ensemble=fake_ensemble, progress=quiet())
    assert summary.computed == 12 - done.sum() and summary.n_ok == 12
    whole = tmp_path / "whole.h5"
    run_batch(TINY, csv, whole, chunk_size=2, ensemble=fake_ensemble, progress=quiet())
    assert_same_file(whole, out)


def test_mismatched_config_table_or_chunk_size_is_refused(tmp_path, mixed):
    out = tmp_path / "out.h5"
    run_batch(TINY, mixed, out, chunk_size=2, ensemble=fake_ensemble, progress=quiet())
    before = read_all(out)
    other = {**TINY, "precision": {**TINY["precision"], "rtol": 1e-5}}
    with pytest.raises(BatchError, match=r"different config \(precision.rtol: file 0.0001, "
                                         r"now 1e-05\)"):
        run_batch(other, mixed, out, ensemble=fake_ensemble, progress=quiet())
    renamed = {**TINY, "name": "renamed"}          # the name is not part of the config's identity
    assert run_batch(renamed, mixed, out, ensemble=fake_ensemble, progress=quiet()).computed == 0
    table = write_csv(tmp_path / "other.csv", ("h",), [(0.7,)])
    with pytest.raises(BatchError, match="different parameter table"):
        run_batch(TINY, table, out, ensemble=fake_ensemble, progress=quiet())
    with pytest.raises(BatchError, match="--chunk-size 2"):
        run_batch(TINY, mixed, out, chunk_size=3, ensemble=fake_ensemble, progress=quiet())
    assert_same_file(out, out)
    after = read_all(out)
    for name in DATASETS:
        np.testing.assert_array_equal(before[name], after[name])
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as h5:
        h5["x"] = 1
    with pytest.raises(BatchError, match="not a batch file"):
        run_batch(TINY, mixed, foreign, ensemble=fake_ensemble, progress=quiet())


def test_errors_fail_their_chunk_only_and_are_retried(tmp_path):
    rows = [(0.67, 0.965), (0.68, 0.99), (0.69, 0.96), (0.70, 0.95)]
    csv = write_csv(tmp_path / "p.csv", ("h", "n_s"), rows)
    out = tmp_path / "out.h5"
    RAISE["on"] = True
    try:
        summary = run_batch(TINY, csv, out, chunk_size=2, ensemble=fake_ensemble, progress=quiet())
        with h5py.File(out) as h5:
            status, msg = h5["status"][...].tolist(), read_messages(h5["message"])
        assert status == [ERROR, ERROR, OK, OK] and summary.n_left == 2
        assert msg[0] == "RuntimeError: simulated out of memory"
        RAISE["on"] = False
        summary = run_batch(TINY, csv, out, ensemble=fake_ensemble, progress=quiet())
        assert summary.computed == 2 and summary.n_ok == 4 and summary.n_left == 0
        # a cause that fails every chunk stops the batch instead of failing every row
        RAISE["on"] = True
        many = write_csv(tmp_path / "many.csv", ("n_s",), [(0.99,)] * 10)
        with pytest.raises(BatchError, match="first 3 chunks all failed.*out of memory"):
            run_batch(TINY, many, tmp_path / "many.h5", chunk_size=2, ensemble=fake_ensemble,
                      progress=quiet())
        with h5py.File(tmp_path / "many.h5") as h5:
            assert int(np.sum(h5["status"][...] == PENDING)) == 4
    finally:
        RAISE["on"] = True


# =========================================================================== bad input
def test_bad_input_messages(tmp_path, mixed, capsys):
    def refused(header, match, config=TINY, rows=((0.7,),)):
        csv = write_csv(tmp_path / "bad.csv", header, rows)
        with pytest.raises(BatchError, match=match):
            run_batch(config, csv, tmp_path / "bad.h5", ensemble=fake_ensemble, progress=quiet())
        assert not (tmp_path / "bad.h5").exists()

    refused(("omega_cmd",), r"unknown column 'omega_cmd'; did you mean 'omega_cdm'\?")
    refused(("h", "h"), "column 'h' appears twice")
    refused(("h", ""), "empty column name", rows=((0.7, 1),))
    two_species = {**TINY, "cosmology": {**TINY["cosmology"], "m_ncdm": [0.02, 0.03],
                                         "N_ur": 1.0}}
    refused(("m_ncdm",), "single massive species, but the config has 2", config=two_species,
            rows=((0.06,),))
    (tmp_path / "empty.csv").write_text("# nothing here\n")
    with pytest.raises(BatchError, match="no header line"):
        run_batch(TINY, tmp_path / "empty.csv", tmp_path / "e.h5", progress=quiet())
    with pytest.raises(BatchError, match="cannot read the parameter table"):
        run_batch(TINY, tmp_path / "missing.csv", tmp_path / "e.h5", progress=quiet())
    with pytest.raises(BatchError, match="such does not exist; create the folder"):
        run_batch(TINY, mixed, tmp_path / "no" / "such" / "out.h5", ensemble=fake_ensemble,
                  progress=quiet())
    (tmp_path / "a_file").write_text("")
    with pytest.raises(BatchError, match="a_file is not a folder"):
        run_batch(TINY, mixed, tmp_path / "a_file" / "out.h5", ensemble=fake_ensemble,
                  progress=quiet())
    if sys.platform.startswith("linux"):   # a folder nobody (not even root) can create files in
        with pytest.raises(BatchError, match=r"cannot write the output file /proc/b.h5 \(No "):
            run_batch(TINY, mixed, "/proc/b.h5", ensemble=fake_ensemble, progress=quiet())
    with pytest.raises(BatchError, match="invalid config"):
        run_batch({"cosmology": {"h": 0.7}}, mixed, tmp_path / "e.h5", progress=quiet())
    # the command: one line, exit code 2, nothing written
    code = batch_cli.main(["--config", "lcdm", "--params",
                           str(write_csv(tmp_path / "c.csv", ("Omega_b",), [(0.05,)])),
                           "--out", str(tmp_path / "c.h5"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "did you mean 'omega_b'" in err and err.count("\n") == 1
    assert not (tmp_path / "c.h5").exists()


# =========================================================================== devices, progress
def test_devices_and_one_thread_per_device(tmp_path, mixed):
    devices = jax.devices()
    assert resolve_devices("all") == devices and resolve_devices("0") == devices[:1]
    for bad in ("x", str(len(devices)), "0,0", "0,9", "-1", ""):
        with pytest.raises(BatchError, match="visible"):
            resolve_devices(bad)
    single = tmp_path / "single.h5"
    run_batch(TINY, mixed, single, chunk_size=2, ensemble=fake_ensemble, devices="all",
              progress=quiet())
    # two device threads (both on the one CPU device here): the path a 2-GPU machine takes
    seen = []

    def solve(prepared, backend):
        from boltzmann.batch.compute import solve_chunk
        seen.append(str(jax.config.jax_default_device))
        return solve_chunk(prepared, backend)

    both = LocalExecutor([devices[0], devices[0]], lambda d: "jax", solve_fn=solve)
    shared = tmp_path / "threads.h5"
    run_batch(TINY, mixed, shared, chunk_size=2, ensemble=fake_ensemble, executor=both,
              progress=quiet())
    assert len(seen) == 5 and set(seen) == {str(devices[0])}
    assert_same_file(single, shared)


def test_progress_line_rate_and_eta():
    now = [0.0]
    lines = []
    stream = types.SimpleNamespace(write=lines.append, flush=lambda: None, isatty=lambda: False)
    p = BatchProgress(1000, stream=stream, clock=lambda: now[0], log_every_s=1e9)
    for t, done, failed in ((100.0, 10, 1), (110.0, 110, 1), (120.0, 210, 2)):
        now[0] = t        # the first chunk carries the compilation: no rate from it
        p.rows(done, failed)   # the third is under 10 % after the second: not logged
    assert "10/1000 rows" in lines[0] and "ETA after the first chunks" in lines[0]
    assert "110/1000" in lines[1] and "10 rows/s" in lines[1] and "ETA 1 min 29 s" in lines[1]
    assert len(lines) == 2
    assert format_duration(7500) == "2 h 05 min" and format_duration(3 * 86400 + 7200) == "3 d 2 h"


# =========================================================================== Dask
def test_dask_local_cluster_equals_local_run(tmp_path, mixed):
    """Chunks as tasks of two worker processes, gathered into one file by the client."""
    distributed = pytest.importorskip("distributed")
    local = tmp_path / "local.h5"
    run_batch(TINY, mixed, local, chunk_size=2, ensemble=fake_ensemble, progress=quiet())
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        remote = tmp_path / "dask.h5"
        summary = run_batch(TINY, mixed, remote, chunk_size=2, ensemble=fake_ensemble,
                            scheduler=cluster.scheduler_address, progress=quiet())
    assert summary.chunks == 5
    assert_same_file(local, remote)


# =========================================================================== real physics
@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A table of the tiny config computed uninterrupted, and interrupted after one chunk then
    resumed; rows 0 and 1 are one chunk (launch size 2), row 3 fails validation."""
    tmp = tmp_path_factory.mktemp("real")
    rows = [(0.67, 0.12, None), (0.70, 0.11, 2.0e-9), (0.66, 0.125, None), (5.0, 0.12, None),
            (0.68, 0.118, None)]
    csv = write_csv(tmp / "p.csv", ("h", "omega_cdm", "A_s"), rows)
    whole = tmp / "whole.h5"
    run_batch(TINY, csv, whole, chunk_size=2, backend="jax", progress=quiet())
    part = tmp / "part.h5"

    def stop(result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_batch(TINY, csv, part, chunk_size=2, backend="jax", on_chunk=stop, progress=quiet())
    resumed = run_batch(TINY, csv, part, backend="jax", progress=quiet())
    return types.SimpleNamespace(csv=csv, whole=whole, part=part, resumed=resumed, rows=rows)


def test_real_rows_are_the_ensemble_results(real):
    cfg = load_config(TINY)
    base = base_block(cfg.cosmology)
    cosmos = [row_cosmology(base, ("h", "omega_cdm", "A_s"),
                            np.array([np.nan if v is None else v for v in r], float))
              for r in real.rows[:2]]
    direct = ensemble.run_ensemble(cosmos, cfg.precision, cfg.output, backend="jax")
    f = read_all(real.whole)
    assert f["status"].tolist() == [OK, OK, OK, INVALID, OK]
    np.testing.assert_array_equal(f["pk_m"][:2], direct.spectra.pk_m)
    np.testing.assert_array_equal(f["pk_cb"][:2], direct.spectra.pk_cb)
    np.testing.assert_array_equal(f["sigma8"][:2], direct.spectra.sigma8)
    np.testing.assert_array_equal(f["k"][:2], direct.k)
    np.testing.assert_array_equal(f["derived/z_star"][:2], direct.tables.derived["z_star"])
    ok = f["status"] == OK
    assert np.all(np.isfinite(f["pk_m"][ok])) and np.all(f["pk_m"][ok] > 0)
    assert 0.6 < f["sigma8"][0, 0] < 1.0 and np.all(np.isnan(f["pk_m"][3]))
    assert "out of range" in f["message"][3].decode()


def test_real_resumed_file_equals_uninterrupted_bit_for_bit(real):
    assert real.resumed.computed == 3 and real.resumed.n_ok == 4
    assert_same_file(real.whole, real.part)


# =========================================================================== slow
@pytest.mark.slow
def test_real_dask_local_cluster_equals_local_run(real, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        out = tmp_path / "dask.h5"
        run_batch(TINY, real.csv, out, chunk_size=2, backend="jax",
                  scheduler=cluster.scheduler_address, progress=quiet())
    assert_same_file(real.whole, out)


TWO_DEVICES = """
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
import jax
jax.config.update("jax_enable_x64", True)
assert len(jax.devices()) == 2, jax.devices()
import test_batch as tb
from boltzmann.batch import run_batch
from boltzmann.batch.compute import solve_chunk
from boltzmann.batch.executors import LocalExecutor
seen = []
def solve(prepared, backend):
    seen.append(str(jax.config.jax_default_device))
    return solve_chunk(prepared, backend)
def on_device_0(prepared, backend):   # the two-device run's device 0 reuses these programs
    with jax.default_device(jax.devices()[0]):
        return solve_chunk(prepared, backend)
one = LocalExecutor(jax.devices()[:1], lambda d: "jax", solve_fn=on_device_0)
run_batch(tb.TINY, {csv!r}, {one!r}, chunk_size=2, backend="jax", executor=one,
          progress=tb.quiet())
ex = LocalExecutor(jax.devices(), lambda d: "jax", solve_fn=solve)
run_batch(tb.TINY, {csv!r}, {two!r}, chunk_size=2, backend="jax", executor=ex,
          progress=tb.quiet())
print("devices used:", len(set(seen)))
"""


@pytest.mark.slow
def test_two_host_devices_equal_one_device(tmp_path):
    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    rows = [(0.60 + 0.02 * i, 0.11 + 0.002 * i) for i in range(8)]
    csv = write_csv(tmp_path / "p.csv", ("h", "omega_cdm"), rows)
    code = TWO_DEVICES.format(repo=str(REPO), tests=str(REPO / "tests"), csv=str(csv),
                              one=str(one), two=str(two))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "devices used: 2" in done.stdout, done.stdout
    assert_same_file(one, two)


@pytest.mark.slow
def test_command_killed_and_rerun_equals_uninterrupted(real, tmp_path):
    out = tmp_path / "cli.h5"
    cmd = [sys.executable, str(REPO / "scripts" / "batch.py"), "--config",
           str(write_yaml(tmp_path / "tiny.yaml")), "--params", str(real.csv), "--out", str(out),
           "--chunk-size", "2", "--backend", "jax"]
    env = {**os.environ, "BOLTZMANN_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOLTZMANN_CACHE", None)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stderr:
            if line.startswith("batch: ") and " rows (" in line:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=600)
    with h5py.File(out) as h5:
        assert int(np.sum(h5["status"][...] != PENDING)) >= 2
    rerun = subprocess.run(cmd + ["--quiet"], capture_output=True, text=True, env=env,
                           timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "5 rows: 4 ok, 1 invalid input row" in rerun.stdout
    assert_same_file(real.whole, out)


def write_yaml(path):
    import yaml

    Path(path).write_text(yaml.safe_dump(TINY))
    return path
