"""The command-line job (boltzmann.cli, scripts/transfer.py) on a fake perturbation stage.

The fake run returns CLASS's own transfer functions from tests/data (z = 0) and a rescaled copy as
a second redshift, and forms P(k) and σ8 from them with the real spectra stage, so expected
numbers come from the reference data, not from constants.
"""
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from boltzmann import cli, output, plots, spectra
from boltzmann.ensemble import Result, stack_cosmologies
from boltzmann.params import CosmoParams
from boltzmann.perturbations import Transfers
from boltzmann.progress import ProgressReporter
from boltzmann.tables import Tables

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]
GROWTH_Z05 = 0.77  # arbitrary rescaling that makes the fake z = 0.5 block differ from z = 0
NAMES = ("d_g", "d_b", "d_cdm", "d_ur", "d_ncdm[0]", "d_m", "t_g", "t_b", "h_prime", "eta")


@pytest.fixture(scope="module")
def reference():
    params = yaml.safe_load((DATA / "params.yaml").read_text())
    k, cols = output.read_pk_csv(DATA / "class_lcdm_tk.csv")
    return params, k, cols


def _fake_run_factory(reference, k_max=None, failed=None, calls=None):
    """A stand-in for pipeline.run: CLASS's transfers as stage 2, the real stage 3.

    failed: {k index: status code} of modes to report as failed."""
    params, k, cols = reference
    common = params["class_input"]["common"]
    keep = np.ones(k.size, bool) if k_max is None else k <= k_max
    cosmo = CosmoParams.make(**{n: common[n] for n in ("h", "omega_b", "omega_cdm", "A_s", "n_s",
                                                        "k_pivot", "tau_reio", "YHe", "T_cmb")},
                             N_ur=2.0308, m_ncdm=[0.06])
    z0 = {name: cols[name][keep] for name in NAMES}
    # d_cb is formed by the spectra stage from d_cdm, d_b (CLASS's tk file has no d_cb column)
    fields = {n: np.stack([v, GROWTH_Z05 * v])[None] for n, v in z0.items()}

    def run(config, *, backend="auto", progress=None, gradients=False, release_compiled=False):
        if calls is not None:
            calls.append((config, backend, gradients))
        for done in range(0, 5):
            progress("perturbations", done, 4)
        K = int(keep.sum())
        status = np.zeros((1, K), int)
        for i, code in (failed or {}).items():
            status[0, i] = code
        transfers = Transfers(k=k[keep][None], z=(0.0, 0.5), k_h=None, fields=fields,
                              status=status, n_accepted=np.ones((1, K), int),
                              n_rejected=np.zeros((1, K), int), backend="fake")
        tables = Tables(grid=None, model_table=np.zeros((1, 1, 2, 2)),
                        derived={"z_reio": np.array([7.7])}, device="cpu")
        stacked = stack_cosmologies([cosmo])
        return Result(cosmologies=[cosmo], tables=tables, transfers=transfers,
                      spectra=spectra.compute_spectra(transfers, stacked),
                      timings={"tables": 0.01, "perturbations": 0.5, "spectra": 0.1})
    return run


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    """A config file plus a stand-in loader, so these tests do not depend on params.py's schema."""
    path = tmp_path / "lcdm.yaml"
    path.write_text("name: fake\n")
    monkeypatch.setattr(cli, "_load_config", lambda p: SimpleNamespace(
        name="fake-lcdm", output=SimpleNamespace(dir=str(tmp_path / "default_out"))))
    return path


def _main(argv, run):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([str(a) for a in argv], run=run, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _header(path):
    return [line for line in Path(path).read_text().splitlines() if line.startswith("#")][-1]


def test_cli_writes_the_three_files_with_exact_headers(reference, config_file, tmp_path):
    params, _, _ = reference
    out_dir = tmp_path / "run"
    calls = []
    code, out, err = _main(["--config", config_file, "--out", out_dir, "--no-plot", "--backend", "jax"],
                           _fake_run_factory(reference, calls=calls))
    assert code == 0, err
    assert calls[0][1] == "jax" and calls[0][2] is False
    assert _header(out_dir / "pk.csv") == "# k_1/Mpc,P_m_z0_Mpc3,P_m_z0.5_Mpc3,P_cb_z0_Mpc3,P_cb_z0.5_Mpc3"
    tk_header = _header(out_dir / "tk.csv")[2:].split(",")
    assert tk_header[:2] == ["k_1/Mpc", "d_g_z0"] and "d_ncdm[0]_z0.5" in tk_header and "eta_z0.5" in tk_header
    assert not (out_dir / "pk.png").exists()

    k, pk_cols = output.read_pk_csv(out_dir / "pk.csv")
    common = params["class_input"]["common"]
    _, tk_cols = output.read_pk_csv(out_dir / "tk.csv")
    expected = spectra.power_from_transfer(k, tk_cols["d_m_z0.5"], common["A_s"], common["n_s"], common["k_pivot"])
    np.testing.assert_allclose(pk_cols["P_m_z0.5_Mpc3"], expected, rtol=1e-8)
    np.testing.assert_allclose(pk_cols["P_m_z0.5_Mpc3"], GROWTH_Z05**2 * pk_cols["P_m_z0_Mpc3"], rtol=1e-8)

    summary = json.loads((out_dir / "summary.json").read_text())
    derived = params["derived"]["class_massive"]
    # CLASS's transfers on CLASS's native k grid must give CLASS's sigma8 (d_cb formed from omega_b, omega_cdm)
    assert summary["sigma8"]["0"] == pytest.approx(derived["sigma8"], rel=1e-4)
    assert summary["sigma8_cb"]["0"] == pytest.approx(derived["sigma8_cb"], rel=1e-4)
    assert summary["sigma8"]["0.5"] == pytest.approx(GROWTH_Z05 * summary["sigma8"]["0"], rel=1e-10)
    assert summary["backend"] == "fake" and summary["parameters"]["h"] == common["h"]
    assert {"tables", "perturbations", "spectra", "write"} <= set(summary["timings_s"])
    # classy's names; the fake tables give z_reio only, so θ_s and r_d (which need z_rec, z_d)
    # are left out and the background numbers come from the cosmology
    assert summary["derived"]["z_reio"] == 7.7 and "100*theta_s" not in summary["derived"]
    assert summary["derived"]["sigma8"] == summary["sigma8"]["0"]
    assert summary["derived"]["Omega_Lambda"] == pytest.approx(derived["Omega0_lambda"], rel=1e-6)
    assert summary["derived"]["age"] == pytest.approx(derived["age"], rel=1e-6)
    assert "perturbations: 4/4" in err and "timings:" in err
    assert "sigma8 =" in out


def test_cli_uses_config_output_dir_by_default_and_plots(reference, config_file, tmp_path):
    code, _, err = _main(["--config", config_file, "--quiet"], _fake_run_factory(reference))
    assert code == 0, err
    assert err == ""
    for name in ("pk.csv", "tk.csv", "summary.json", "pk.png"):
        assert (tmp_path / "default_out" / name).is_file()


def test_cli_compare_adds_ratio_panel(reference, config_file, tmp_path, monkeypatch):
    figures = []
    original = plots.plot_pk

    def capture(*args, **kwargs):
        figures.append(original(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(plots, "plot_pk", capture)
    out_dir = tmp_path / "cmp"
    code, _, err = _main(["--config", config_file, "--out", out_dir, "--quiet", "--compare",
                          DATA / "class_lcdm_pk.csv"], _fake_run_factory(reference))
    assert code == 0, err
    assert (out_dir / "pk.png").stat().st_size > 10_000
    ax_main, ax_ratio = figures[0].axes
    assert ax_main.get_xscale() == "log" and ax_main.get_yscale() == "log"
    # P_m z0, P_cb z0 are shared with the CLASS file (z0.5 is not): two ratio curves
    assert len(ax_ratio.get_lines()) >= 2
    ratio = ax_ratio.get_lines()[0].get_ydata() * plots.RATIO_UNIT
    assert np.max(np.abs(ratio)) < 5e-3  # CLASS transfers vs CLASS P(k): only interpolation differences


def test_ratio_to_reference_is_zero_for_identical_spectra():
    k, cols = output.read_pk_csv(DATA / "class_lcdm_pk.csv")
    k_our = np.logspace(-3, 0, 50)
    pk_our = np.exp(np.interp(np.log(k_our), np.log(k), np.log(cols["P_m_z0_Mpc3"])))
    k_over, ratio = plots.ratio_to_reference(k, cols["P_m_z0_Mpc3"], k, cols["P_m_z0_Mpc3"])
    assert k_over.size == k.size and np.max(np.abs(ratio)) < 1e-12
    k_over, _ = plots.ratio_to_reference(np.logspace(-6, 2, 30), np.ones(30), k, cols["P_m_z0_Mpc3"])
    assert k_over.min() >= k[0] and k_over.max() <= k[-1]
    assert pk_our.size == 50


def test_missing_config_and_compare_file_exit_2(reference, tmp_path):
    code, _, err = _main(["--config", tmp_path / "nope.yaml"], _fake_run_factory(reference))
    assert code == 2 and "nope.yaml" in err and "Traceback" not in err and err.count("\n") == 1


def test_missing_compare_file_exit_2(reference, config_file, tmp_path):
    code, _, err = _main(["--config", config_file, "--compare", tmp_path / "ref.csv"], _fake_run_factory(reference))
    assert code == 2 and "ref.csv" in err


def test_bad_config_names_the_key(tmp_path, reference):
    params = pytest.importorskip("boltzmann.params")
    assert hasattr(params, "load_config")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cosmology:\n  h: 0.6736\n  omega_bb: 0.02237\n")
    code, _, err = _main(["--config", bad], _fake_run_factory(reference))
    assert code == 2
    assert "omega_bb" in err and "Traceback" not in err and err.count("\n") == 1


def test_gradients_and_backend_passed_on(reference, config_file, tmp_path):
    base = _fake_run_factory(reference)
    seen = {}
    names = ["h", "n_s"]

    def run(config, *, backend="auto", progress=None, gradients=False, release_compiled=False):
        seen.update(gradients=gradients, backend=backend)
        result = base(config, backend=backend, progress=progress)
        K = result.k.shape[1]
        result.gradients = {"parameters": names, "dlnP_m": np.ones((2, K, 2)),
                            "dlnP_cb": np.zeros((2, K, 2)), "summary": {"sigma8": {"A_s": 1.0}}}
        return result

    code, _, err = _main(["--config", config_file, "--gradients", "--quiet", "--no-plot",
                          "--backend", "jax", "--out", tmp_path / "g"], run)
    assert code == 0, err
    assert seen == {"gradients": True, "backend": "jax"}
    assert json.loads((tmp_path / "g" / "summary.json").read_text())["gradients"] == {"sigma8": {"A_s": 1.0}}
    assert _header(tmp_path / "g" / "dpk.csv").startswith("# k_1/Mpc,")


def test_gradients_with_cl_write_dcl_csv(reference, config_file, tmp_path):
    """With C_ℓ derivatives in the result (pipeline.run on a config with output.cl), dcl.csv:
    ell, then dln<X>/dθ (dTE/dθ for TE) per output and parameter, every ℓ a row."""
    from boltzmann import output as out

    base = _fake_run_factory(reference)
    names = ["h", "tau_reio"]
    ell = np.arange(2, 31, dtype=float)
    deriv = {"TT": np.full((ell.size, 2), 0.5), "TE": np.full((ell.size, 2), -3.0),
             "lensed_BB": np.full((ell.size, 2), 2.0)}

    def run(config, *, backend="auto", progress=None, gradients=False, release_compiled=False):
        result = base(config, backend=backend, progress=progress)
        K = result.k.shape[1]
        result.gradients = {"parameters": names, "dlnP_m": np.ones((2, K, 2)),
                            "dlnP_cb": np.zeros((2, K, 2)), "summary": {}}
        result.cl_gradients = {"ell": ell, "parameters": names, "derivative": deriv,
                               "summary": {"parameters": names, "seconds": 1.0}}
        return result

    code, _, err = _main(["--config", config_file, "--gradients", "--quiet", "--no-plot",
                          "--out", tmp_path / "g"], run)
    assert code == 0, err
    header = _header(tmp_path / "g" / "dcl.csv")
    assert header == "# " + ",".join(["ell", "dlnTT/dh", "dlnTT/dtau_reio", "dTE/dh",
                                      "dTE/dtau_reio", "dlnlensed_BB/dh",
                                      "dlnlensed_BB/dtau_reio"])
    table = np.loadtxt(tmp_path / "g" / "dcl.csv", delimiter=",")
    assert table.shape == (ell.size, 7) and np.all(table[:, 0] == ell)
    assert np.all(table[:, 3] == -3.0) and np.all(table[:, 6] == 2.0)
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["cl_gradients"]["parameters"] == names
    with pytest.raises(ValueError, match="shape"):
        out.write_dcl_csv(tmp_path / "bad.csv", {"ell": ell, "parameters": names,
                                                 "derivative": {"TT": np.ones((3, 2))}}, ())


def test_failed_modes_are_named(reference, config_file):
    from solver import Status, describe

    _, k, _ = reference
    code, _, err = _main(["--config", config_file, "--quiet"],
                         _fake_run_factory(reference, failed={3: int(Status.MAX_STEPS),
                                                              7: int(Status.MAX_STEPS)}))
    assert code == 1
    reason = describe(int(Status.MAX_STEPS))
    assert "2 of" in err and f"{k[3]:.4g}" in err and f"{k[7]:.4g}" in err and reason in err
    assert err.count("\n") == 1


def test_pipeline_exception_is_one_line_unless_debug(reference, config_file):
    def run(config, *, backend="auto", progress=None, gradients=False, release_compiled=False):
        raise RuntimeError("thermodynamics did not converge\nat z = 1100")

    code, _, err = _main(["--config", config_file], run)
    assert code == 1 and "thermodynamics did not converge at z = 1100" in err and err.count("\n") == 1
    with pytest.raises(RuntimeError):
        _main(["--config", config_file, "--debug"], run)


def test_narrow_k_range_writes_files_then_fails_naming_needed_k(reference, config_file, tmp_path):
    out_dir = tmp_path / "narrow"
    code, _, err = _main(["--config", config_file, "--out", out_dir, "--quiet", "--no-plot"],
                         _fake_run_factory(reference, k_max=0.5))
    assert code == 1 and "needs k from" in err and "1/Mpc" in err
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["sigma8"]["0"] is None and summary["sigma8_problems"]
    assert (out_dir / "pk.csv").is_file()


def test_progress_reporter_plain_and_tty_modes():
    plain = io.StringIO()
    reporter = ProgressReporter(stream=plain, interactive=False)
    for done in range(101):
        reporter("perturbations", done, 100)
    lines = plain.getvalue().splitlines()
    assert 10 <= len(lines) <= 12 and lines[-1].startswith("perturbations: 100/100")
    assert "perturbations" in reporter.timings

    tty = io.StringIO()
    reporter = ProgressReporter(stream=tty, interactive=True)
    reporter("background", 0, 1)
    reporter("background", 1, 1)
    reporter("perturbations", 1, 3)
    reporter.close()
    text = tty.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and "perturbations: 1/3" in text

    quiet = io.StringIO()
    reporter = ProgressReporter(stream=quiet, enabled=False)
    reporter("x", 1, 2)
    assert quiet.getvalue() == "" and "x" in reporter.timings


def test_first_use_lines_say_what_compiles_once_per_stage():
    """With a cold cache (something compiled already) each compiling stage says, once, what it
    compiles and where it is kept; with a warm cache (nothing compiled) or --quiet, nothing."""
    seen = []
    settings = SimpleNamespace(cache_root=Path("/tmp/cache-root"))

    def run(compiled, quiet=False):
        err = io.StringIO()
        report = cli._first_use_notes(lambda *a: seen.append(a), settings,
                                      SimpleNamespace(compiled=compiled), err, quiet)
        for stage in ("tables", "perturbations", "perturbations", "gradients", "gradients"):
            report(stage, 0, 1)
        report("cmb gradients", 1, 1)   # not at its start: no line
        return err.getvalue().splitlines()

    cold = run(compiled=3)
    assert len(cold) == 2 and "the perturbation solver" in cold[0]
    assert "sensitivity solver" in cold[1] and "/tmp/cache-root" in cold[1]
    assert run(compiled=0) == [] and run(compiled=3, quiet=True) == []
    assert len(seen) == 18   # progress itself always passed on


def test_script_help_and_clean_failure():
    script = REPO / "scripts" / "transfer.py"
    help_run = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert help_run.returncode == 0 and "--compare" in help_run.stdout
    bad = subprocess.run([sys.executable, str(script), "--config", "no_such_config_xyz"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "no_such_config_xyz" in bad.stderr and "Traceback" not in bad.stderr


def test_bare_config_name_with_real_loader(reference, tmp_path):
    params = pytest.importorskip("boltzmann.params")
    if not (REPO / "configs" / "lcdm.yaml").is_file():
        pytest.skip("configs/lcdm.yaml not present")
    seen = []
    code, _, err = _main(["--config", "lcdm", "--out", tmp_path / "o", "--quiet", "--no-plot"],
                         _fake_run_factory(reference, calls=seen))
    assert code == 0, err
    assert isinstance(seen[0][0], params.Config)
    assert (tmp_path / "o" / "summary.json").is_file()


def test_release_compiled_clears_jax_caches_before_the_derivatives(monkeypatch):
    """``pipeline.run(..., release_compiled=True)`` (the CLI's one-shot process) drops the main
    job's compiled programs before the derivative programs compile; a caller that will run
    again (the default) keeps them."""
    from boltzmann import pipeline
    from boltzmann.params import load_config

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "lcdm.yaml")
    calls = []
    monkeypatch.setattr(pipeline, "run_ensemble",
                        lambda *a, **k: SimpleNamespace(timings={}, cl=None))
    monkeypatch.setattr(pipeline.jax, "clear_caches", lambda: calls.append("clear"))
    monkeypatch.setattr(pipeline, "derivative_tables",
                        lambda *a, **k: calls.append(("derivatives", k["release_inputs"])) or {})
    pipeline.run(config, backend="jax", gradients=True, release_compiled=True)
    assert calls == ["clear", ("derivatives", True)]
    calls.clear()
    pipeline.run(config, backend="jax", gradients=True)
    assert calls == [("derivatives", False)]


@pytest.mark.parametrize("stored", [False, True])
def test_gradients_preload_the_solve_program_while_the_main_job_runs(monkeypatch, stored):
    """With gradients, ``pipeline.run`` builds the derivatives' function before the main job and
    asks it to preload its stored solve program; the derivatives then use that same function.
    While a load is in progress the one-shot process does not clear JAX's caches under it."""
    from boltzmann import pipeline
    from boltzmann.params import load_config

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "lcdm.yaml")
    calls = []
    fake = SimpleNamespace(preload=lambda: calls.append("preload") or stored)
    monkeypatch.setattr(pipeline, "power_spectrum_function", lambda *a, **k: fake)
    monkeypatch.setattr(pipeline, "run_ensemble",
                        lambda *a, **k: calls.append("main job") or SimpleNamespace(timings={},
                                                                                     cl=None))
    monkeypatch.setattr(pipeline.jax, "clear_caches", lambda: calls.append("clear"))
    monkeypatch.setattr(pipeline, "derivative_tables",
                        lambda *a, **k: calls.append(("derivatives", k["fn"] is fake)) or {})
    pipeline.run(config, backend="jax", gradients=True, release_compiled=True)
    assert calls == ["preload", "main job"] + ([] if stored else ["clear"]) + [
        ("derivatives", True)]
