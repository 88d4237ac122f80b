"""The classy facade (boltzmann.classy): the CLI's numbers to 1e-12, a classy script unchanged but
for its import, CLASS's parameter names translated, unsupported options refused clearly.

One test-sized configuration (massless neutrinos, short hierarchies, k to 1 h/Mpc) runs through
the CLI and through ``Class`` with the same CLASS-named parameters; both are the same pipeline, so
the numbers agree to rounding. The C_ℓ tests (raw_cl, lensed_cl, the CLI's cl.csv, cl.png and its
``--compare`` against CLASS) use the smallest CMB run the stage allows: l_max = 30, lensed (so
the unlensed spectra run to ℓ = 1030), with the same short hierarchies.
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from boltzmann import class_input, cli, pipeline, plots
from boltzmann.classy import (Class, ClNotAvailable, CosmoSevereError, UnsupportedOption)
from boltzmann.output import read_pk_csv

DATA = Path(__file__).parent / "data"

COSMOLOGY = {"h": 0.6736, "omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9, "n_s": 0.9649,
             "tau_reio": 0.0544, "YHe": 0.2454, "N_ur": 3.044}
PRECISION = {"l_max_g": 6, "l_max_pol_g": 4, "l_max_ur": 6, "rtol": 1e-4}
K_MAX_H, K_PER_DECADE, Z, Z_BACKGROUND = 1.0, 4, [0.0, 1.0], [0.5, 1.0]
#: the same run in CLASS's names (tol_perturbations_integration is CLASS's name for rtol)
CLASS_PARAMETERS = {**COSMOLOGY, "output": "mPk", "P_k_max_h/Mpc": K_MAX_H,
                    "k_per_decade_for_pk": K_PER_DECADE, "z_pk": "0,0.5,1", "l_max_g": 6,
                    "l_max_pol_g": 4, "l_max_ur": 6, "tol_perturbations_integration": 1e-4}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """The CLI on the test-sized config: (in-memory result, summary.json, background.csv)."""
    folder = tmp_path_factory.mktemp("facade")
    config = {"name": "facade", "cosmology": COSMOLOGY, "precision": PRECISION,
              "output": {"z": Z, "z_background": Z_BACKGROUND, "k_max": K_MAX_H,
                         "k_per_decade": K_PER_DECADE}}
    (folder / "facade.yaml").write_text(yaml.safe_dump(config))
    captured = {}

    def run(cfg, **kwargs):
        captured["result"] = pipeline.run(cfg, **kwargs)
        return captured["result"]

    code = cli.main(["--config", str(folder / "facade.yaml"), "--out", str(folder / "out"),
                     "--no-plot", "--quiet", "--backend", "jax"], run=run)
    assert code == 0
    summary = json.loads((folder / "out" / "summary.json").read_text())
    z_bg, background = read_pk_csv(folder / "out" / "background.csv")
    return captured["result"], summary, z_bg, background


@pytest.fixture(scope="module")
def cosmo():
    c = Class(backend="jax")
    c.set(CLASS_PARAMETERS)
    c.compute()
    return c


def test_facade_reproduces_the_cli(cli_run, cosmo):
    result, summary, z_bg, background = cli_run
    k = result.k[0]
    for iz, z in enumerate(result.z):
        if z in Z:
            np.testing.assert_allclose(cosmo.pk_lin(k, z), result.spectra.pk_m[0, iz], rtol=1e-12)
            np.testing.assert_allclose(cosmo.pk_cb_lin(k, z), result.spectra.pk_cb[0, iz],
                                       rtol=1e-12)
            assert cosmo.pk(float(k[3]), z) == pytest.approx(result.spectra.pk_m[0, iz, 3],
                                                             rel=1e-12)
    assert cosmo.sigma8() == pytest.approx(summary["sigma8"]["0"], rel=1e-12)
    assert cosmo.sigma8_cb() == pytest.approx(summary["sigma8_cb"]["0"], rel=1e-12)
    assert cosmo.sigma(8.0, 1.0, h_units=True) == pytest.approx(summary["sigma8"]["1"], rel=1e-12)
    # background.csv holds the computed doubles exactly (17 digits)
    np.testing.assert_allclose(cosmo.Hubble(z_bg), background["H_1/Mpc"], rtol=1e-12)
    np.testing.assert_allclose(cosmo.angular_distance(z_bg), background["D_A_Mpc"], rtol=1e-12)
    np.testing.assert_allclose(cosmo.comoving_distance(z_bg), background["D_M_Mpc"], rtol=1e-12)
    np.testing.assert_allclose(cosmo.scale_independent_growth_factor_f(z_bg), background["f"],
                               rtol=1e-12)
    np.testing.assert_allclose([cosmo.sigma(8.0, z, h_units=True) for z in z_bg],
                               background["sigma8"], rtol=1e-12)
    assert cosmo.Hubble(0.5) == pytest.approx(float(background["H_1/Mpc"][0]), rel=1e-12)
    derived = cosmo.get_current_derived_parameters(list(summary["derived"]))
    assert set(summary["derived"]) >= {"100*theta_s", "rs_d", "z_d", "z_star", "z_reio", "age",
                                       "Neff", "Omega_m", "Omega_Lambda", "sigma8"}
    for name, value in summary["derived"].items():
        assert derived[name] == pytest.approx(value, rel=1e-12), name
    assert cosmo.theta_s_100() == pytest.approx(summary["derived"]["100*theta_s"], rel=1e-12)
    assert cosmo.rs_drag == pytest.approx(summary["derived"]["rs_d"], rel=1e-12)
    assert cosmo.h() == cosmo.h == COSMOLOGY["h"] and cosmo.Omega_m() > 0.3


#: a classy script as one finds them; only the import line differs (test below)
CLASSY_SCRIPT = '''
from classy import Class
import numpy as np

params = PARAMETERS
cosmo = Class()
cosmo.set(params)
cosmo.compute()
h = cosmo.h()
kk = np.logspace(-4, 0, 30) * h                      # 1/Mpc
pk = np.array([cosmo.pk_lin(k, 0.0) for k in kk])    # Mpc^3
pk1 = np.array([cosmo.pk(k, 1.0) for k in kk])
s8 = cosmo.sigma8()
fs8 = cosmo.scale_independent_growth_factor_f(0.5) * cosmo.sigma(8.0 / h, 0.5)
derived = cosmo.get_current_derived_parameters(["100*theta_s", "rs_d", "z_d", "age", "Neff"])
H, DA = cosmo.Hubble(1.0), cosmo.angular_distance(1.0)
cosmo.struct_cleanup()
cosmo.empty()
'''


def _run_script(source):
    names = {"PARAMETERS": dict(CLASS_PARAMETERS)}
    exec(compile(source, "classy_script", "exec"), names)
    return names


def test_classy_style_script_runs_with_one_changed_import(cosmo):
    source = CLASSY_SCRIPT.replace("from classy import Class", "from boltzmann.classy import Class")
    assert source.count("\n") == CLASSY_SCRIPT.count("\n")
    names = _run_script(source)
    h = COSMOLOGY["h"]
    kk = np.logspace(-4, 0, 30) * h
    assert names["pk"].shape == (30,) and np.all(names["pk"] > 0)
    # the script's own Class ran the same computation as the fixture's
    np.testing.assert_allclose(names["pk"], cosmo.pk_lin(kk, 0.0), rtol=1e-12)
    assert names["s8"] == pytest.approx(cosmo.sigma8(), rel=1e-12)
    assert 0.3 < names["fs8"] < 0.6 and names["derived"]["rs_d"] > 140
    assert np.all(names["pk1"] < names["pk"])
    assert names["DA"] == pytest.approx(cosmo.angular_distance(1.0), rel=1e-12)


def test_the_script_is_a_classy_script(cosmo):
    """The same script with CLASS itself (classy, the ``reference`` extra): it runs, and what
    does not depend on the short hierarchies of this test-sized run agrees with CLASS."""
    pytest.importorskip("classy")
    ours = _run_script(CLASSY_SCRIPT.replace("from classy import Class",
                                             "from boltzmann.classy import Class"))
    theirs = _run_script(CLASSY_SCRIPT)
    assert ours["H"] == pytest.approx(theirs["H"], rel=1e-5)
    assert ours["DA"] == pytest.approx(theirs["DA"], rel=1e-5)
    for name, bar in (("100*theta_s", 1e-4), ("rs_d", 5e-4), ("age", 1e-5), ("Neff", 1e-6)):
        assert ours["derived"][name] == pytest.approx(theirs["derived"][name], rel=bar), name
    assert abs(ours["derived"]["z_d"] - theirs["derived"]["z_d"]) < 0.1
    # P(k) and σ8: ℓmax = 6 and 4 wavenumbers per decade here, so only roughly CLASS's
    assert ours["s8"] == pytest.approx(theirs["s8"], rel=0.03)
    assert np.max(np.abs(ours["pk"][:12] / theirs["pk"][:12] - 1)) < 0.03


def test_between_the_nodes(cosmo):
    """z_pk and z_max_pk give a grid in ln(1+z) as fine as Z_STEP_LN; between its nodes P(k, z)
    follows the growth factor (massless ν: scale-independent growth), between the k nodes the
    spline stays between its neighbours on this smooth, coarse grid."""
    c = Class()
    config, settings = class_input.to_config(CLASS_PARAMETERS)
    z_grid = config["output"]["z"]
    assert z_grid[0] == 0.0 and z_grid[-1] == 1.0 and 0.5 in z_grid
    assert np.max(np.diff(np.log1p(z_grid))) <= class_input.Z_STEP_LN + 1e-12
    assert settings["z_pk"] == [0.0, 0.5, 1.0] and settings["outputs"] == {"mPk"}
    assert c.set(CLASS_PARAMETERS) is True and c.set(CLASS_PARAMETERS) is False
    k = 0.1
    growth = (cosmo.scale_independent_growth_factor(0.27)
              / cosmo.scale_independent_growth_factor(0.0)) ** 2
    assert cosmo.pk_lin(k, 0.27) / cosmo.pk_lin(k, 0.0) == pytest.approx(growth, rel=2e-3)
    nodes = cosmo.result.k[0]
    mid = np.sqrt(nodes[4] * nodes[5])
    lo, hi = sorted([cosmo.pk_lin(nodes[4], 0.0), cosmo.pk_lin(nodes[5], 0.0)])
    assert lo < cosmo.pk_lin(mid, 0.0) < hi


def test_translation_of_class_names():
    config, _ = class_input.to_config({
        "H0": 70.0, "Omega_b": 0.05, "Omega_cdm": 0.25, "ln_A_s_1e10": 3.05, "n_s": 0.96,
        "N_ur": 1.0176, "N_ncdm": 2, "m_ncdm": "0.1,0.1", "T_ncdm": 0.71611,
        "w0_fld": -0.9, "wa_fld": 0.1, "Omega_Lambda": 0, "use_ppf": "no",
        "output": "mPk,mTk", "P_k_max_1/Mpc": 2.0, "z_max_pk": 2.0,
        "tol_perturbations_integration": 1e-6, "k_per_decade_for_bao": 200,
        "ncdm_fluid_approximation": 3, "background_verbose": 1})
    c = config["cosmology"]
    assert c["h"] == 0.7 and c["omega_b"] == pytest.approx(0.05 * 0.49)
    assert c["omega_cdm"] == pytest.approx(0.25 * 0.49) and c["ln10^{10}A_s"] == 3.05
    assert "A_s" not in c and c["m_ncdm"] == [0.1, 0.1] and c["N_ncdm"] == 2
    assert c["w0_fld"] == -0.9 and c["tau_reio"] == class_input.CLASS_DEFAULTS["tau_reio"]
    assert config["output"]["k_max"] == pytest.approx(2.0 / 0.7)
    assert config["output"]["z"][-1] == 2.0 and config["precision"] == {"rtol": 1e-6}
    defaults, _ = class_input.to_config({})
    assert defaults["cosmology"]["h"] == 0.6781
    assert defaults["output"]["k_max"] == pytest.approx(1.0 / 0.6781)  # P_k_max = 1/Mpc


@pytest.mark.parametrize("pars, needles", [
    ({"non_linear": "halofit"}, ["non_linear", "linear", "pk_lin"]),
    ({"omega_cdmm": 0.12}, ["omega_cdmm", "omega_cdm"]),
    ({"Omega_k": 0.1}, ["Omega_k", "flat"]),
    ({"100*theta_s": 1.04}, ["100*theta_s", "h or H0"]),
    ({"z_reio": 7.7}, ["z_reio", "tau_reio"]),
    ({"YHe": "BBN"}, ["YHe", "number"]),
    ({"output": "mPk,sd"}, ["output", "'sd'"]),
    ({"modes": "s,t"}, ["modes", "scalar"]),
    ({"recombination": "HyRec"}, ["recombination", "leave"]),
    ({"Omega_fld": 0.7}, ["Omega_fld", "w0_fld"]),
    ({"sigma8": 0.8}, ["sigma8", "A_s"]),
])
def test_unsupported_options_raise_clear_errors(pars, needles):
    with pytest.raises(UnsupportedOption) as info:
        c = Class()
        c.set(pars)
        class_input.to_config(c.pars)
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)
    assert isinstance(info.value, CosmoSevereError) and isinstance(info.value, ValueError)


def test_queries_outside_what_was_computed_raise(cosmo):
    with pytest.raises(ClNotAvailable, match="No Cl computed: add tCl"):
        cosmo.raw_cl(2500)
    with pytest.raises(CosmoSevereError, match="No Cl computed"):
        cosmo.lensed_cl(2500)
    with pytest.raises(ClNotAvailable, match="CLASS itself"):
        cosmo.density_cl()
    with pytest.raises(CosmoSevereError, match="P_k_max"):
        cosmo.pk_lin(5.0, 0.0)
    with pytest.raises(CosmoSevereError, match="z_max_pk"):
        cosmo.pk_lin(0.1, 3.0)
    with pytest.raises(CosmoSevereError, match="unknown derived parameter 'foo'"):
        cosmo.get_current_derived_parameters(["foo"])
    assert cosmo.pk_lin(0.0, 0.0) == 0.0
    k0 = float(cosmo.result.k[0, 0])
    p = cosmo.pk_lin(k0 / 10, 0.0)          # CLASS's extrapolation: P ∝ k P_R(k)
    assert p / cosmo.pk_lin(k0, 0.0) == pytest.approx(0.1 ** COSMOLOGY["n_s"], rel=1e-12)
    pk, k, z = cosmo.get_pk_and_k_and_z(nonlinear=False)
    assert pk.shape == (k.size, z.size) and z[0] > z[-1] == 0.0
    with pytest.raises(CosmoSevereError, match="nonlinear=False"):
        cosmo.get_pk_and_k_and_z()


def test_background_only_run_gives_background_and_derived(cosmo):
    """No mPk: no perturbation solve; the background and thermodynamic numbers are the same
    functions as in the full run, and asking for P(k) or σ8 says what to add."""
    c = Class()
    c.set({k: v for k, v in CLASS_PARAMETERS.items() if k != "output"})
    c.compute()
    assert c.result is None
    assert c.Hubble(1.0) == pytest.approx(cosmo.Hubble(1.0), rel=1e-14)
    d = c.get_current_derived_parameters(["100*theta_s", "rs_d", "z_d", "age"])
    ref = cosmo.get_current_derived_parameters(["100*theta_s", "rs_d", "z_d", "age"])
    for name in d:
        assert d[name] == pytest.approx(ref[name], rel=1e-9), name
    with pytest.raises(CosmoSevereError, match="mPk"):
        c.pk_lin(0.1, 0.0)
    with pytest.raises(CosmoSevereError, match="mPk"):
        c.sigma8()
    assert math.isfinite(c.age())


# ------------------------------------------------------------------ C_ℓ
L_MAX = 30
CL_CONFIG_OUTPUT = {"z": [0.0], "k_max": K_MAX_H, "k_per_decade": K_PER_DECADE,
                    "cl": ["TT", "EE", "TE", "BB", "PP"], "l_max": L_MAX, "lensing": True}
#: the same in CLASS's names (the P(k) part as the CLI's: k to 1 h/Mpc at z = 0)
CL_PARAMETERS = {**COSMOLOGY, "output": "tCl,pCl,lCl,mPk", "lensing": "yes",
                 "l_max_scalars": L_MAX, "P_k_max_h/Mpc": K_MAX_H,
                 "k_per_decade_for_pk": K_PER_DECADE, "l_max_g": 6, "l_max_pol_g": 4,
                 "l_max_ur": 6, "tol_perturbations_integration": 1e-4}


@pytest.fixture(scope="module")
def cl_cli_run(tmp_path_factory):
    """The CLI with C_ℓ (plots on; ``--compare`` when classy is installed):
    (in-memory result, output folder, stderr)."""
    import io

    from boltzmann import class_reference

    folder = tmp_path_factory.mktemp("facade_cl")
    config = {"name": "facade_cl", "cosmology": COSMOLOGY, "precision": PRECISION,
              "output": CL_CONFIG_OUTPUT}
    (folder / "facade_cl.yaml").write_text(yaml.safe_dump(config))
    captured = {}

    def run(cfg, **kwargs):
        captured["result"] = pipeline.run(cfg, **kwargs)
        return captured["result"]

    figures = []
    original = plots.plot_cl

    def plot_cl(*args, **kwargs):
        figures.append(original(*args, **kwargs))
        return figures[-1]

    err = io.StringIO()
    argv = ["--config", str(folder / "facade_cl.yaml"), "--out", str(folder / "out"), "--quiet",
            "--backend", "jax"] + (["--compare"] if class_reference.available() else [])
    plots.plot_cl = plot_cl
    try:
        code = cli.main(argv, run=run, stderr=err)
    finally:
        plots.plot_cl = original
    assert code == 0, err.getvalue()
    return captured["result"], folder / "out", err.getvalue(), figures


@pytest.fixture(scope="module")
def cl_cosmo():
    c = Class(backend="jax")
    c.set(CL_PARAMETERS)
    c.compute()
    return c


def _dimensionless(d_ell, ell, T_cmb, pp=False):
    """cl.csv's D_ℓ (μK²; PP: [ℓ(ℓ+1)]² C/2π) → classy's dimensionless C_ℓ."""
    f = ell * (ell + 1.0) / (2 * math.pi)
    return d_ell / (f * ell * (ell + 1.0)) if pp else d_ell / f / (1e6 * T_cmb) ** 2


def test_raw_and_lensed_cl_are_the_clis_numbers(cl_cli_run, cl_cosmo):
    result, out, _, _ = cl_cli_run
    spectra = result.cl
    T = spectra.T_cmb
    raw, lensed = cl_cosmo.raw_cl(), cl_cosmo.lensed_cl(L_MAX)
    assert set(raw) == set(lensed) == {"ell", "tt", "ee", "te", "bb", "pp"}
    for cls in (raw, lensed):
        np.testing.assert_array_equal(cls["ell"], np.arange(L_MAX + 1))
        for name in ("tt", "ee", "te", "bb", "pp"):
            assert cls[name].shape == (L_MAX + 1,) and np.all(cls[name][:2] == 0.0)
    ell = spectra.ell
    t2 = (1e6 * T) ** 2
    # the in-memory numbers of the CLI run (doubles) to 1e-12
    for name in ("TT", "EE", "TE"):
        np.testing.assert_allclose(raw[name.lower()][ell], spectra.cl[name] / t2, rtol=1e-12)
    for name in ("TT", "EE", "TE", "BB"):
        np.testing.assert_allclose(lensed[name.lower()][ell], spectra.lensed[name] / t2,
                                   rtol=1e-12)
    np.testing.assert_allclose(raw["pp"][ell], spectra.cl["PP"], rtol=1e-12)
    np.testing.assert_array_equal(lensed["pp"], raw["pp"])      # CLASS's lensed_cl: unlensed φφ
    assert np.all(raw["bb"] == 0.0) and np.all(lensed["bb"][2:] > 0)
    # and cl.csv / cl_lensed.csv, converted (the files hold 10 significant digits)
    e, cols = read_pk_csv(out / "cl.csv")
    e = e.astype(int)
    for name in ("TT", "EE", "TE"):
        np.testing.assert_allclose(raw[name.lower()][e], _dimensionless(cols[name], e, T),
                                   rtol=1e-9)
    np.testing.assert_allclose(raw["pp"][e], _dimensionless(cols["PP"], e, T, pp=True), rtol=1e-9)
    e, cols = read_pk_csv(out / "cl_lensed.csv")
    e = e.astype(int)
    for name in ("TT", "EE", "TE", "BB"):
        np.testing.assert_allclose(lensed[name.lower()][e], _dimensionless(cols[name], e, T),
                                   rtol=1e-9)
    assert cl_cosmo.raw_cl(10)["tt"].shape == (11,)
    with pytest.raises(CosmoSevereError, match=f"Can only compute up to lmax={L_MAX}"):
        cl_cosmo.lensed_cl(L_MAX + 1)


#: a classy script for lensed C_ℓ as one finds them; only the import line differs (test below)
CLASSY_CL_SCRIPT = '''
from classy import Class
import numpy as np

cosmo = Class()
cosmo.set(PARAMETERS)
cosmo.set({"output": "tCl,pCl,lCl", "lensing": "yes", "l_max_scalars": 30})
cosmo.compute()
cls = cosmo.lensed_cl(30)
ell = cls["ell"][2:]
dl_tt = ell * (ell + 1) / (2 * np.pi) * cls["tt"][2:] * (1e6 * cosmo.T_cmb()) ** 2   # muK^2
dl_ee = ell * (ell + 1) / (2 * np.pi) * cls["ee"][2:] * (1e6 * cosmo.T_cmb()) ** 2
raw = cosmo.raw_cl()
cosmo.struct_cleanup()
cosmo.empty()
'''
#: the script's parameters: the test-sized cosmology and hierarchies (no mPk: C_ℓ alone)
SCRIPT_CL_PARAMETERS = {**COSMOLOGY, "l_max_g": 6, "l_max_pol_g": 4, "l_max_ur": 6,
                        "tol_perturbations_integration": 1e-4}


def _run_cl_script(source):
    names = {"PARAMETERS": dict(SCRIPT_CL_PARAMETERS)}
    exec(compile(source, "classy_cl_script", "exec"), names)
    return names


def test_classy_cl_script_runs_with_one_changed_import(cl_cli_run):
    """Without mPk the facade runs the CMB stage alone (no P(k) modes): the same C_ℓ as the
    CLI's run, which solved the P(k) modes too."""
    source = CLASSY_CL_SCRIPT.replace("from classy import Class",
                                      "from boltzmann.classy import Class")
    assert source.count("\n") == CLASSY_CL_SCRIPT.count("\n")
    ours = _run_cl_script(source)
    spectra = cl_cli_run[0].cl
    np.testing.assert_allclose(ours["dl_tt"], spectra.d_ell(lensed=True)["TT"], rtol=1e-12)
    np.testing.assert_allclose(ours["dl_ee"], spectra.d_ell(lensed=True)["EE"], rtol=1e-12)
    assert set(ours["raw"]) == {"ell", "tt", "ee", "te", "bb", "pp"}
    # units and conventions: CLASS's high-precision lensed spectra of this cosmology
    # (tests/data/class_cl.csv, every ℓ ≤ 30); the short hierarchies of this run leave < 1e-3
    # in TT and 3 % in EE (ℓmax,pol = 4, at the trough ℓ ≈ 15-20) here
    ref = np.loadtxt(DATA / "class_cl.csv", delimiter=",")
    ref = ref[ref[:, 0] <= L_MAX]
    assert np.max(np.abs(ours["dl_tt"] / ref[:, 5] - 1)) < 2e-3
    assert np.max(np.abs(ours["dl_ee"] / ref[:, 6] - 1)) < 5e-2
    if not class_reference_available():
        pytest.skip("classy is not installed: the script was not run with CLASS itself")
    theirs = _run_cl_script(CLASSY_CL_SCRIPT)
    # CLASS's keys are ours plus its cross-spectrum with the potential (not computed here);
    # its numbers at l_max_scalars = 30 are not its accurate ones (boltzmann.class_reference)
    assert set(theirs["raw"]) - set(ours["raw"]) == {"tp"}
    assert theirs["dl_tt"].shape == ours["dl_tt"].shape


def class_reference_available():
    from boltzmann import class_reference

    return class_reference.available()


def test_cl_requests_translate_as_class_decides():
    """Which spectra exist follows CLASS: tCl → TT, pCl → EE (BB with lensing), both → TE,
    lCl → PP; l_max_scalars below the stage's 30 is served from an l_max = 30 run."""
    def request(**pars):
        config, settings = class_input.to_config(pars)
        return config["output"].get("cl"), config["output"].get("l_max"), settings["cl"]

    assert request(output="tCl")[0] == ["TT"]
    assert request(output="pCl")[0] == ["EE"]
    assert request(output="tCl,pCl")[0] == ["TT", "EE", "TE"]
    cl, l_max, settings = request(output="tCl,pCl,lCl,mPk", lensing="yes", l_max_scalars=2000)
    assert cl == ["TT", "EE", "TE", "BB", "PP"] and l_max == 2000 and settings["lensing"]
    cl, l_max, settings = request(output="tCl lCl", l_max_scalars=20)
    assert cl == ["TT", "PP"] and l_max == 30 and settings["l_max"] == 20
    assert request(output="mPk")[0] is None
    assert request(output="tCl", lensing="no")[2]["lensing"] is False
    for pars, needle in (({"output": "tCl,pCl", "lensing": "yes"}, "'lCl'"),
                         ({"output": "mPk", "lensing": "yes"}, "lensing = no"),
                         ({"output": "tCl", "lensing": "maybe"}, "yes or no"),
                         ({"output": "tCl", "l_max_scalars": 6000}, "l_max_scalars"),
                         ({"output": "tCl", "l_max_scalars": "many"}, "integer")):
        with pytest.raises(CosmoSevereError, match=needle):
            class_input.to_config(pars)


def test_cl_not_requested_says_what_to_add():
    """Asked before computing: the request alone decides, nothing is solved."""
    c = Class()
    c.set({**SCRIPT_CL_PARAMETERS, "output": "tCl,lCl"})
    with pytest.raises(ClNotAvailable, match="lensing = yes"):
        c.lensed_cl()
    assert not c.computed
    c.set({"output": "mPk"})
    with pytest.raises(ClNotAvailable, match="add tCl"):
        c.raw_cl()
    assert not c.computed


def test_cli_writes_cl_png_and_compares_with_class(cl_cli_run):
    _, out, err, figures = cl_cli_run
    assert (out / "cl.png").stat().st_size > 10_000 and (out / "pk.png").is_file()
    # one panel per spectrum (TT, EE, TE, BB, PP), lensed where computed
    top = figures[0].axes[:5]
    assert [len(ax.get_lines()) >= 1 for ax in top] == [True] * 5
    if not class_reference_available():
        pytest.skip("classy is not installed: --compare was not run")
    # CLASS's numbers beside ours, in the same layouts, and the ratio row drawn from them
    assert err == ""
    for name in ("class_pk.csv", "class_cl.csv", "class_cl_lensed.csv"):
        assert (out / name).is_file(), name
    ratio_row = figures[0].axes[5:]
    assert len(ratio_row) == 5
    tt_ratio = ratio_row[0].get_lines()[0].get_ydata() * plots.RATIO_UNIT
    assert tt_ratio.size == L_MAX - 1 and np.max(np.abs(tt_ratio)) < 3e-3
    e, theirs = read_pk_csv(out / "class_cl_lensed.csv")
    _, ours = read_pk_csv(out / "cl_lensed.csv")
    assert np.max(np.abs(ours["TT"] / theirs["TT"] - 1)) < 3e-3
    k, pk_theirs = read_pk_csv(out / "class_pk.csv")
    _, pk_ours = read_pk_csv(out / "pk.csv")
    assert np.max(np.abs(pk_ours["P_m_z0_Mpc3"][:8] / pk_theirs["P_m_z0_Mpc3"][:8] - 1)) < 0.03


#: configs/lcdm.yaml in CLASS's names (its precision block is the default one)
LCDM_CLASS_PARAMETERS = {"h": 0.6736, "omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9,
                         "n_s": 0.9649, "k_pivot": 0.05, "tau_reio": 0.0544, "YHe": 0.2454,
                         "T_cmb": 2.7255, "N_ur": 2.0308, "N_ncdm": 1, "m_ncdm": 0.06,
                         "deg_ncdm": 1.0, "T_ncdm": 0.71611, "output": "mPk", "z_pk": "0,1",
                         "P_k_min_h/Mpc": 1e-4, "P_k_max_h/Mpc": 10.0,
                         "k_per_decade_for_pk": 20}


@pytest.mark.slow  # the main job twice at full precision: minutes on 2 cores
def test_facade_reproduces_the_cli_for_configs_lcdm(tmp_path):
    """The facade with configs/lcdm.yaml's parameters gives the CLI's P(k), σ8, H, D_A and
    derived numbers to 1e-12."""
    captured = {}

    def run(cfg, **kwargs):
        captured["result"] = pipeline.run(cfg, **kwargs)
        return captured["result"]

    code = cli.main(["--config", "configs/lcdm.yaml", "--out", str(tmp_path), "--no-plot",
                     "--quiet", "--backend", "jax"], run=run)
    assert code == 0
    result = captured["result"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    c = Class(backend="jax")
    c.set(LCDM_CLASS_PARAMETERS)
    c.compute()
    k = result.k[0]
    for iz, z in enumerate(result.z):
        np.testing.assert_allclose(c.pk_lin(k, z), result.spectra.pk_m[0, iz], rtol=1e-12)
        np.testing.assert_allclose(c.pk_cb_lin(k, z), result.spectra.pk_cb[0, iz], rtol=1e-12)
    assert c.sigma8() == pytest.approx(summary["sigma8"]["0"], rel=1e-12)
    derived = c.get_current_derived_parameters(list(summary["derived"]))
    for name, value in summary["derived"].items():
        assert derived[name] == pytest.approx(value, rel=1e-12), name
    from boltzmann import derived as derived_mod
    table = derived_mod.background_table(result.cosmologies[0], np.array([0.5, 1.0]))
    np.testing.assert_allclose(c.Hubble(np.array([0.5, 1.0])), table["H_1/Mpc"], rtol=1e-12)
    np.testing.assert_allclose(c.angular_distance(np.array([0.5, 1.0])), table["D_A_Mpc"],
                               rtol=1e-12)
