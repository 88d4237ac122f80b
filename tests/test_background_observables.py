"""Background observables and derived parameters against CLASS, their derivatives, and σ8 from a
short requested k range.

CLASS references: tests/data/class_lcdm_background.csv (CLASS's own background table, massive ν),
tests/data/params.yaml (derived numbers of the same run) and tests/data/class_background.*
(generate_background.py: CLASS's Hubble/angular_distance/growth functions at chosen redshifts
and get_current_derived_parameters, for configs/lcdm.yaml and configs/wcdm_heavy_nu.yaml).
Bars (CLASS at raised precision): H, D_A <= 1e-4; 100 θ_s <= 1e-4; r_d <= 5e-4; f <= 1e-3.
"""
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from boltzmann import derived, distances, ensemble, load_config, modes
from boltzmann.gradients import DERIVED_OUTPUTS, PowerSpectrumFunction
from boltzmann.output import read_pk_csv

DATA = Path(__file__).parent / "data"


def _class_background_cases():
    lines = [line for line in (DATA / "class_background.csv").read_text().splitlines()
             if line and not line.startswith("#")]
    cases = {}
    for line in lines:
        name, *values = line.split(",")
        cases.setdefault(name, []).append([float(v) for v in values])
    meta = yaml.safe_load((DATA / "class_background.yaml").read_text())
    names = ["z", "H_1/Mpc", "D_A_Mpc", "D_M_Mpc", "D", "f", "sigma8"]
    return {n: (dict(zip(names, np.array(rows).T)), meta["cases"][n]) for n, rows in cases.items()}


CLASS_CASES = _class_background_cases()
CONFIG_OF = {"lcdm": "lcdm", "wcdm_heavy_nu": "wcdm_heavy_nu"}


def test_background_table_against_class_lcdm():
    """Every row of CLASS's background table (z <= 1e4): H, D_A; the growth rate f below z = 1000
    (above, CLASS's f keeps a trace of its start at f = 2, where ours starts on the Meszaros
    growing mode: 6e-4 apart at z = 1000, 4.5 % at z = 1e4; distances.growth)."""
    cosmo = load_config("lcdm").cosmology
    z, cols = read_pk_csv(DATA / "class_lcdm_background.csv")
    sel = (z > 1e-4) & (z <= 1e4)
    H = np.asarray(distances.hubble(cosmo, z[sel]))
    DA = np.asarray(distances.angular_distance(cosmo, z[sel]))
    _, f = distances.growth(cosmo, z[sel])
    assert np.max(np.abs(H / cols["H [1/Mpc]"][sel] - 1)) < 1e-5        # measured 5.9e-7
    assert np.max(np.abs(DA / cols["ang.diam.dist."][sel] - 1)) < 1e-5  # measured 1.4e-8
    err_f = np.abs(np.asarray(f) / cols["gr.fac. f"][sel] - 1)
    assert np.max(err_f[z[sel] <= 1000]) < 1e-3            # measured 6.1e-4, all at z > 900
    assert np.max(err_f[z[sel] <= 100]) < 1e-5             # measured 2.8e-6
    # the sound horizon is what θ_s and r_d are made of
    rs = np.asarray(distances.sound_horizon(cosmo, z[sel]))
    assert np.max(np.abs(rs / cols["comov.snd.hrz."][sel] - 1)) < 1e-5  # measured 6.6e-7


@pytest.mark.parametrize("case", sorted(CLASS_CASES))
def test_background_at_survey_redshifts_against_class(case):
    cols, _ = CLASS_CASES[case]
    cosmo = load_config(CONFIG_OF[case]).cosmology
    table = derived.background_table(cosmo, cols["z"])
    assert np.max(np.abs(table["H_1/Mpc"] / cols["H_1/Mpc"] - 1)) < 1e-4
    pos = cols["z"] > 0
    assert np.max(np.abs(table["D_A_Mpc"][pos] / cols["D_A_Mpc"][pos] - 1)) < 1e-4
    assert np.max(np.abs(table["D_M_Mpc"][pos] / cols["D_M_Mpc"][pos] - 1)) < 1e-4
    assert np.max(np.abs(table["f"] / cols["f"] - 1)) < 1e-3
    assert np.max(np.abs(table["D"] / cols["D"] - 1)) < 1e-3


@pytest.fixture(scope="module")
def lcdm_derived():
    """Derived numbers of configs/lcdm.yaml with the thermodynamics on the pipeline's grid."""
    cfg = load_config("lcdm")
    fn = jax.jit(derived.derived_from_thermodynamics, static_argnums=1)
    return {k: float(v) for k, v in fn(cfg.cosmology, modes.make_grid(cfg.precision)).items()}


def test_derived_parameters_against_class(lcdm_derived):
    ours = lcdm_derived
    ref = yaml.safe_load((DATA / "params.yaml").read_text())["derived"]["class_massive"]
    new = CLASS_CASES["lcdm"][1]["derived"]
    for name, bar in (("100*theta_s", 1e-4), ("rs_d", 5e-4), ("age", 1e-5),
                      ("conformal_age", 1e-5), ("Neff", 1e-8), ("Omega_m", 1e-5),
                      ("100*theta_star", 1e-4), ("rs_rec", 5e-4), ("rs_star", 5e-4)):
        assert ours[name] == pytest.approx(ref[name], rel=bar), name
        assert ours[name] == pytest.approx(new[name], rel=bar), name
    assert ours["Omega_Lambda"] == pytest.approx(new["Omega0_lambda"], rel=1e-5)
    # RECFAST-type recombination vs CLASS's HyRec (docs/thermodynamics.md): a few 0.01 in z
    for name in ("z_d", "z_star", "z_rec"):
        assert abs(ours[name] - new[name]) < 0.1, name
    assert abs(ours["z_reio"] - new["z_reio"]) < 0.02


def test_fluid_cosmology_derived_background_numbers():
    """A w0-wa fluid: Omega_fld from closure and the background part of the derived numbers."""
    cosmo = load_config("wcdm_heavy_nu").cosmology
    _, meta = CLASS_CASES["wcdm_heavy_nu"]
    ref = meta["derived"]
    values = derived.derived_parameters(cosmo, {})
    assert float(values["Omega_fld"]) == pytest.approx(ref["Omega0_fld"], rel=1e-5)
    assert float(values["Omega_Lambda"]) == 0.0
    assert float(values["age"]) == pytest.approx(ref["age"], rel=1e-5)
    assert float(values["Neff"]) == pytest.approx(ref["Neff"], rel=1e-6)
    # without the thermodynamic redshifts θ_s and r_d are left out, not made up
    assert "100*theta_s" not in values and "rs_d" not in values


def test_background_quantities_are_differentiable():
    """jax.jacfwd of H, D_A, f, r_s(z_d) and the age in (h, omega_cdm) equals central differences."""
    cosmo = load_config("lcdm").cosmology
    z = jnp.array([0.3, 1.0, 2.3])

    def observables(theta):
        c = dataclasses.replace(cosmo, h=theta[0], omega_cdm=theta[1])
        _, f = distances.growth(c, z)
        return jnp.concatenate([distances.hubble(c, z), distances.angular_distance(c, z), f,
                                jnp.stack([distances.sound_horizon(c, 1060.0),
                                           distances.age_gyr(c)])])

    theta = jnp.array([float(cosmo.h), float(cosmo.omega_cdm)])
    jac = np.asarray(jax.jit(jax.jacfwd(observables))(theta))
    fn = jax.jit(observables)
    for j, step in enumerate((1e-4, 1e-5)):
        e = np.zeros(2)
        e[j] = step
        fd = (np.asarray(fn(theta + e)) - np.asarray(fn(theta - e))) / (2 * step)
        np.testing.assert_allclose(jac[:, j], fd, rtol=2e-6, atol=1e-12 * np.max(np.abs(fd)))


def _tiny(k_max):
    """A cheap massless ΛCDM run (unconverged hierarchy; the comparison is of two runs)."""
    cfg = load_config("lcdm_massless")
    prec = dataclasses.replace(cfg.precision, l_max_g=6, l_max_pol_g=4, l_max_ur=6, rtol=1e-4,
                               bg_n_lna=600)
    out = dataclasses.replace(cfg.output, z=(0.0,), z_background=(1.0,), k_min=1e-4,
                              k_max=k_max, k_per_decade=5)
    return cfg, prec, out


@pytest.fixture(scope="module")
def short_and_long():
    """The tiny run with k_max = 0.4 h/Mpc (too short for σ8) and with 10 h/Mpc."""
    cfg, prec, out_short = _tiny(10 ** -0.4)
    _, _, out_long = _tiny(10.0)
    short = ensemble.run_ensemble([cfg.cosmology], prec, out_short, backend="jax")
    long = ensemble.run_ensemble([cfg.cosmology], prec, out_long, backend="jax")
    return cfg, prec, out_short, short, long


def test_sigma8_whatever_the_k_range(short_and_long):
    """k_max = 0.4 h/Mpc (too short for σ8): the run solves the modes σ8 needs, reports P(k) on
    the requested grid only, and σ8 equals a run to 10 h/Mpc within 1e-5 (at both redshifts)."""
    cfg, prec, out_short, short, long = short_and_long
    assert short.failures() == [] and long.failures() == []
    assert short.spectra.problems == [] and long.spectra.problems == []
    k_req = out_short.k_grid(float(cfg.cosmology.h))
    np.testing.assert_array_equal(short.k[0], k_req)
    assert short.spectra.pk_m.shape == (1, 2, k_req.size) and short.z == (0.0, 1.0)
    assert short.spectra.sigma8_k[0, -1] >= modes.SIGMA8_K_RANGE_H[1] * float(cfg.cosmology.h)
    np.testing.assert_allclose(short.spectra.sigma8, long.spectra.sigma8, rtol=1e-5)
    np.testing.assert_allclose(short.spectra.sigma8_cb, long.spectra.sigma8_cb, rtol=1e-5)
    # the requested modes are the same modes in both runs (their k an ulp apart: two logspace
    # calls, so the adaptive steps may differ within the solver's tolerance; measured 1.5e-7)
    np.testing.assert_allclose(short.k[0], long.k[0][:k_req.size], rtol=1e-14)
    np.testing.assert_allclose(short.spectra.pk_m[0], long.spectra.pk_m[0][:, :k_req.size],
                               rtol=1e-5)


def test_sigma8_grid_extends_only_what_is_missing():
    h = np.array([0.7])
    k_h = np.logspace(-4, 1, 101)
    k, kh, keep = modes.sigma8_grid(k_h[None] * h[:, None], k_h, h)
    assert k.shape == (1, 101) and keep.tolist() == list(range(101))
    k_h = np.logspace(-2, 0, 21)                      # 10 per decade, 0.01 ... 1 h/Mpc
    k, kh, keep = modes.sigma8_grid(k_h[None] * h[:, None], k_h, h)
    np.testing.assert_array_equal(kh[keep], k_h)
    assert kh[0] <= modes.SIGMA8_K_RANGE_H[0] and kh[-1] >= modes.SIGMA8_K_RANGE_H[1]
    np.testing.assert_allclose(np.diff(np.log10(kh)), 0.1, rtol=1e-9)  # the request's density
    k_file = np.array([0.05, 0.1, 0.2])               # a k file in 1/Mpc, shared by cosmologies
    k, kh, keep = modes.sigma8_grid(np.stack([k_file, k_file]), None, [0.6, 0.8])
    assert kh is None and k.shape[0] == 2 and np.all(k[0] == k[1])
    assert k[0, 0] <= 1e-3 * 0.6 and k[0, -1] >= 5.0 * 0.8
    np.testing.assert_array_equal(k[0, keep], k_file)


@pytest.mark.slow  # a PowerSpectrumFunction value program (~40 s); the CLI's σ8 check stays
def test_power_spectrum_function_sigma8_background_and_derived(short_and_long):
    """The differentiable function on the short k range: σ8 from the modes it adds (the same
    wavenumbers as the CLI's, so σ8 as the CLI's and within 1e-5 of the long run), P(k) on the
    request only, and the background and derived outputs equal to background.csv's and
    summary.json's functions (``derived.background_table``, ``derived.result_values``)."""
    cfg, prec, out_short, short, long = short_and_long
    config = dataclasses.replace(cfg, precision=prec, output=out_short)
    fn = PowerSpectrumFunction(config, parameters=("h", "omega_b"), k=short.k[0],
                               z=short.z, n_chunks=1)
    np.testing.assert_allclose(fn.k_solve, short.spectra.sigma8_k[0], rtol=1e-14)
    np.testing.assert_array_equal(fn.k_solve[fn.keep], short.k[0])
    values = {name: np.asarray(v) for name, v in fn().items()}
    assert values["P_m"].shape == (2, short.k.shape[1])
    # the differentiable solve takes its own steps (solve_diff, rtol 1e-4 here): measured
    # P_m 2.6e-6 apart, σ8 5.7e-7 from the short run's and 1.2e-6 from the long run's
    np.testing.assert_allclose(values["P_m"], short.spectra.pk_m[0], rtol=2e-5)
    np.testing.assert_allclose(values["sigma8"], short.spectra.sigma8[0], rtol=1e-5)
    np.testing.assert_allclose(values["sigma8"], long.spectra.sigma8[0], rtol=1e-5)
    # background.csv's columns at z_background (the config's: 1.0)
    np.testing.assert_array_equal(fn.z_background, out_short.z_background)
    table = derived.background_table(cfg.cosmology, fn.z_background)
    for ours, theirs in (("H", "H_1/Mpc"), ("D_A", "D_A_Mpc"), ("D_M", "D_M_Mpc"), ("f", "f")):
        np.testing.assert_allclose(values[ours], table[theirs], rtol=1e-12, err_msg=ours)
    cli = derived.result_values(short)
    for name in DERIVED_OUTPUTS:
        assert float(values[name]) == pytest.approx(cli[name], rel=1e-10), name
    # the cheap background-only function gives the same numbers
    alone = fn.background()
    for name in ("D_A", "rs_d", "100*theta_s"):
        np.testing.assert_array_equal(np.asarray(alone[name]), values[name])


def test_background_outputs_are_differentiable_in_theta():
    """jax.jacfwd of PowerSpectrumFunction.background (H, D_A, D_M, f in h and omega_cdm)
    equals central differences (the derived numbers' derivatives, through the thermodynamics,
    are checked against the full Jacobian in test_gradients.py)."""
    cfg, prec, out = _tiny(10 ** -0.4)
    config = dataclasses.replace(cfg, precision=prec, output=out)
    fn = PowerSpectrumFunction(config, parameters=("h", "omega_cdm"), k=np.array([0.01]),
                               with_sigma8=False, z_background=(0.3, 1.0, 2.3), derived=())
    jac = jax.jit(jax.jacfwd(fn.background))(fn.theta0)
    assert set(jac) == {"H", "D_A", "D_M", "D_H", "f", "D"}
    theta0 = np.asarray(fn.theta0)
    for j, step in enumerate((1e-4, 1e-5)):
        e = np.zeros(2)
        e[j] = step
        up, down = fn.background(theta0 + e), fn.background(theta0 - e)
        for name in ("H", "D_A", "D_M", "f"):
            fd = (np.asarray(up[name]) - np.asarray(down[name])) / (2 * step)
            np.testing.assert_allclose(np.asarray(jac[name])[..., j], fd, rtol=2e-6,
                                       err_msg=f"{name}, θ_{j}")
