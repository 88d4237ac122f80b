"""Background cosmology and Fermi–Dirac integrals vs CLASS (tests/data) and internal consistency."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from scipy.integrate import quad, simpson

from boltzmann import background as bg
from boltzmann import constants as const
from boltzmann import ncdm
from boltzmann.params import load_config

DATA = Path(__file__).parent / "data"
REF = yaml.safe_load((DATA / "params.yaml").read_text())


@pytest.fixture(scope="module")
def lcdm():
    return load_config("lcdm").cosmology


@pytest.fixture(scope="module")
def massless():
    return load_config("lcdm_massless").cosmology


@pytest.fixture(scope="module")
def class_bg():
    path = DATA / "class_lcdm_background.csv"
    header = [ln for ln in path.read_text().splitlines() if ln.startswith("#")][-1]
    names = header[2:].split(",")
    data = np.loadtxt(path, delimiter=",", comments="#")
    return {n: data[:, i] for i, n in enumerate(names)}


def rel(x, y):
    return np.abs(np.asarray(x) / np.asarray(y) - 1.0)


# ----------------------------------------------------------------------------- vs CLASS
def test_hubble_matches_class_all_rows(lcdm, class_bg):
    a = 1.0 / (1.0 + class_bg["z"])
    assert rel(bg.hubble(lcdm, a), class_bg["H [1/Mpc]"]).max() < 1e-5
    assert float(bg.hubble(lcdm, 1.0)) == pytest.approx(float(lcdm.H0), rel=1e-14)


def test_species_densities_match_class(lcdm, class_bg):
    a = 1.0 / (1.0 + class_bg["z"])
    rho = bg.rho_tilde(lcdm, a)
    p = bg.pressure_tilde(lcdm, a)
    for key, col in [("g", "(.)rho_g"), ("b", "(.)rho_b"), ("cdm", "(.)rho_cdm"),
                     ("ur", "(.)rho_ur"), ("lambda", "(.)rho_lambda")]:
        assert rel(rho[key], class_bg[col]).max() < 1e-5, key
    assert rel(rho["ncdm"][0], class_bg["(.)rho_ncdm[0]"]).max() < 1e-4
    assert rel(p["ncdm"][0], class_bg["(.)p_ncdm[0]"]).max() < 1e-4
    # p_tot changes sign near z ~ 3e3 (radiation vs Lambda): compare in units of rho_tot
    dp = np.asarray(bg.p_tot(lcdm, a)) - class_bg["(.)p_tot"]
    assert np.abs(dp / class_bg["(.)rho_tot"]).max() < 1e-5


def test_conformal_and_proper_time_match_class(lcdm, class_bg):
    z = class_bg["z"]
    a = 1.0 / (1.0 + z)
    tau = np.asarray(bg.conformal_time(lcdm, a))
    # CLASS's own tau carries its start-up transient (tau aH - 1 up to 1.6e-4 at z ~ 1e14, where
    # the universe is purely radiation-dominated and tau = 1/(aH) exactly); compare where it has
    # settled and check the exact radiation-era relation everywhere else.
    settled = z < 1e12
    assert rel(tau[settled], class_bg["conf. time [Mpc]"][settled]).max() < 1e-5
    early = z > 1e10
    aH = np.asarray(bg.conformal_hubble(lcdm, a[early]))
    assert np.abs(tau[early] * aH - 1.0).max() < 1e-6
    t_gyr = np.asarray(bg.proper_time(lcdm, a)) / const.GYR_MPC
    assert rel(t_gyr, class_bg["proper time [Gyr]"]).max() < 1e-5


def test_ages_match_class_derived(lcdm, massless):
    for cosmo, key in [(lcdm, "class_massive"), (massless, "class_massless")]:
        d = REF["derived"][key]
        assert float(bg.conformal_age(cosmo)) == pytest.approx(d["conformal_age"], rel=1e-6)
        assert float(bg.age_gyr(cosmo)) == pytest.approx(d["age"], rel=1e-6)


def test_time_quadrature_is_converged(lcdm):
    """The 25 x 8 Gauss–Legendre rule agrees with a brute-force trapezoid on a fine ln a grid."""
    lna = np.linspace(np.log(1e-16), 0.0, 20_001)
    f = 1.0 / np.asarray(bg.conformal_hubble(lcdm, np.exp(lna)))
    brute = simpson(f, x=lna) + 1.0 / float(bg.conformal_hubble(lcdm, 1e-16))
    assert float(bg.conformal_age(lcdm)) == pytest.approx(brute, rel=1e-9)


# ----------------------------------------------------------------------------- consistency
def test_massless_variant_internal_consistency(massless):
    a = np.logspace(-12, 0, 60)
    rho = bg.rho_tilde(massless, a)
    assert rho["ncdm"].shape == (0, 60)
    h2 = sum(np.asarray(v) for k, v in rho.items() if k != "ncdm")
    assert rel(np.asarray(bg.hubble(massless, a)) ** 2, h2).max() < 1e-14
    assert float(bg.hubble(massless, 1.0)) == pytest.approx(float(massless.H0), rel=1e-14)
    # radiation era: tau = 1 / (aH), t = 1 / (2H)
    a_early = np.array([1e-12, 1e-10])
    assert np.allclose(np.asarray(bg.conformal_time(massless, a_early))
                       * np.asarray(bg.conformal_hubble(massless, a_early)), 1.0, rtol=1e-7)
    assert np.allclose(np.asarray(bg.proper_time(massless, a_early))
                       * 2 * np.asarray(bg.hubble(massless, a_early)), 1.0, rtol=1e-7)
    # dH/dlna from the continuity equation equals the AD derivative
    lna = jnp.log(jnp.asarray(a))
    _, dh = jax.jvp(lambda x: bg.hubble(massless, jnp.exp(x)), (lna,), (jnp.ones_like(lna),))
    assert rel(dh, bg.dhubble_dlna(massless, a)).max() < 1e-12


def test_ncdm_equals_radiation_early_and_matter_late(lcdm):
    """One ncdm species at T_ncdm: rho/rho_ur_per_species -> (T_ncdm/T_nu)^4 early; m n late."""
    a_early = 1e-12
    rho = bg.rho_tilde(lcdm, a_early)
    per_species_ur = rho["ur"] / float(lcdm.N_ur)
    expect = (float(lcdm.T_ncdm[0]) / const.T_NU_OVER_T_GAMMA) ** 4
    assert float(rho["ncdm"][0] / per_species_ur) == pytest.approx(expect, rel=1e-9)
    _, p = bg.ncdm_rho_p(lcdm, 1.0)
    r1 = bg.rho_tilde(lcdm, 1.0)["ncdm"]
    assert float(p[0] / r1[0]) < 1e-4  # non-relativistic today (m/T ~ 360)


def test_fluid_with_w_minus_one_is_exactly_lambda(lcdm):
    fld = dataclasses.replace(lcdm, w0_fld=-1.0, wa_fld=0.0, use_fld=True)
    a = np.logspace(-8, 0, 50)
    assert np.array_equal(np.asarray(bg.rho_tilde(fld, a)["fld"]),
                          np.asarray(bg.rho_tilde(lcdm, a)["lambda"]))
    # identical up to floating-point summation order inside the compiled functions
    assert rel(bg.hubble(fld, a), bg.hubble(lcdm, a)).max() < 1e-15
    assert float(bg.conformal_age(fld)) == pytest.approx(float(bg.conformal_age(lcdm)), rel=1e-15)
    assert np.asarray(bg.w_fld(fld, a)) == pytest.approx(-1.0)


def test_cpl_fluid_obeys_continuity():
    c = load_config("wcdm_heavy_nu").cosmology
    lna = jnp.linspace(-8.0, 0.0, 30)
    f = lambda x: jnp.log(bg.rho_tilde(c, jnp.exp(x))["fld"])  # noqa: E731
    _, dlnrho = jax.jvp(f, (lna,), (jnp.ones_like(lna),))
    w = bg.w_fld(c, jnp.exp(lna))
    assert np.allclose(np.asarray(dlnrho), -3.0 * (1.0 + np.asarray(w)), rtol=1e-12, atol=1e-13)
    assert float(bg.hubble(c, 1.0)) == pytest.approx(float(c.H0), rel=1e-14)


# ----------------------------------------------------------------------------- table
def test_background_table_interpolation(lcdm):
    tab = bg.background_table(lcdm, a_min=1e-10, n=2000)
    lna_nodes = np.asarray(tab.lna)
    # exact at nodes
    tau_nodes = np.asarray(bg.conformal_time(lcdm, np.exp(lna_nodes[::97])))
    assert rel(np.asarray(tab.values["tau"])[::97], tau_nodes).max() < 1e-10
    # Hermite between nodes (worst case: midpoints)
    mid = lna_nodes[:-1:7] + 0.5 * tab.dlna
    a_mid = np.exp(mid)
    assert rel(tab.interp("H", mid), bg.hubble(lcdm, a_mid)).max() < 1e-8
    assert rel(tab.interp("tau", mid), bg.conformal_time(lcdm, a_mid)).max() < 1e-8
    assert rel(tab.interp("rho_ncdm", mid)[0], bg.ncdm_rho_p(lcdm, a_mid)[0][0]).max() < 1e-7
    assert rel(tab.interp("p_ncdm", mid)[0], bg.ncdm_rho_p(lcdm, a_mid)[1][0]).max() < 1e-7
    # inverse tau -> ln a
    taus = np.asarray(bg.conformal_time(lcdm, a_mid))
    assert np.abs(np.asarray(tab.lna_of_tau(taus)) - mid).max() < 1e-9
    with pytest.raises(ValueError, match="a_min"):
        bg.background_table(lcdm, a_min=2.0)


def test_table_is_a_pytree_and_jittable(lcdm):
    tab = bg.background_table(lcdm, a_min=1e-8, n=200)
    f = jax.jit(lambda t, x: t.interp("aH", x))
    assert float(f(tab, -3.0)) == pytest.approx(float(bg.conformal_hubble(lcdm, np.exp(-3.0))),
                                                rel=1e-7)


def test_growth_factor_matches_class(lcdm, class_bg):
    z = class_bg["z"]
    late = z < 100
    d, f = bg.growth_factor(lcdm, 1.0 / (1.0 + z[late]))
    assert rel(d, class_bg["gr.fac. D"][late]).max() < 1e-5
    assert rel(f, class_bg["gr.fac. f"][late]).max() < 1e-5
    d1, f1 = bg.growth_factor(lcdm, 1.0)
    assert float(d1) == pytest.approx(1.0, abs=1e-14)


def test_growth_factor_steps_converged(lcdm):
    """The default RK4 steps (``GROWTH_STEPS``) give D and f within 2e-7 of 16000 steps (measured
    7e-8) from z = 1000 to today, and differ from a quarter of them (where the scheme's error
    shows), so the comparison sees the step count."""
    a = 1.0 / (1.0 + np.array([0.0, 0.5, 1.0, 3.0, 10.0, 100.0, 1000.0]))
    fine = [np.asarray(x) for x in bg.growth_factor(lcdm, a, n=16000)]
    default = [np.asarray(x) for x in bg.growth_factor(lcdm, a)]
    coarse = [np.asarray(x) for x in bg.growth_factor(lcdm, a, n=bg.GROWTH_STEPS // 4)]
    for got, ref, rough in zip(default, fine, coarse):
        assert rel(got, ref).max() < 2e-7
        assert rel(rough, ref).max() > 10 * rel(got, ref).max()


# ----------------------------------------------------------------------------- derivatives
def test_gradient_of_conformal_age_matches_finite_differences(lcdm):
    g = jax.grad(bg.conformal_age)(lcdm)
    for name, eps in [("h", 1e-6), ("omega_cdm", 1e-7)]:
        x = float(getattr(lcdm, name))
        up = bg.conformal_age(dataclasses.replace(lcdm, **{name: x + eps}))
        dn = bg.conformal_age(dataclasses.replace(lcdm, **{name: x - eps}))
        fd = float(up - dn) / (2 * eps)
        assert float(getattr(g, name)) == pytest.approx(fd, rel=1e-6), name
    m = np.asarray(lcdm.m_ncdm)
    up = bg.conformal_age(dataclasses.replace(lcdm, m_ncdm=m + 1e-5))
    dn = bg.conformal_age(dataclasses.replace(lcdm, m_ncdm=m - 1e-5))
    assert float(g.m_ncdm[0]) == pytest.approx(float(up - dn) / 2e-5, rel=1e-5)


# ----------------------------------------------------------------------------- FD integrals
def _reference_integrals(M):
    f0 = lambda q: 1.0 / (np.exp(min(q, 700.0)) + 1.0)  # noqa: E731
    i_rho = quad(lambda q: q * q * np.sqrt(q * q + M * M) * f0(q), 0, np.inf,
                 epsabs=0, epsrel=1e-13, limit=400)[0]
    i_p = quad(lambda q: q**4 / (3 * np.sqrt(q * q + M * M)) * f0(q), 0, np.inf,
               epsabs=0, epsrel=1e-13, limit=400)[0]
    return i_rho, i_p


@pytest.fixture(scope="module")
def fd_reference():
    masses = np.concatenate([[0.0], np.logspace(-4, 4, 33)])
    ref = np.array([_reference_integrals(m) for m in masses]).T
    return masses, ref


def test_background_fd_integrals_are_accurate(fd_reference):
    masses, ref = fd_reference
    got = np.array(ncdm.fd_integrals(masses))
    assert rel(got, ref).max() < 1e-10
    # massless limit: 7 pi^4 / 120 and p = rho / 3
    i_rho, i_p = ncdm.fd_integrals(0.0)
    assert float(i_rho) == pytest.approx(7 * np.pi**4 / 120, rel=1e-11)
    assert float(i_p) == pytest.approx(7 * np.pi**4 / 360, rel=1e-11)


def test_background_integral_table_reproduces_the_rule():
    """fd_integrals' default path (the table in ln M) against the 200-node rule summed directly,
    across the table's ends and the series beyond them; its M-derivative as well."""
    rule = ncdm.background_quadrature()
    masses = np.concatenate([[0.0, 1e-6], np.logspace(-4.5, 6.2, 3001)])
    table = np.array(ncdm.fd_integrals(masses))
    direct = np.array(ncdm.quadrature_integrals(masses, rule))
    assert rel(table, direct).max() < 1e-12
    for j in range(2):
        d_tab = np.array(jax.vmap(jax.grad(lambda m: ncdm.fd_integrals(m)[j]))(masses[1:]))
        d_dir = np.array(jax.vmap(jax.grad(lambda m: ncdm.quadrature_integrals(m, rule)[j]))(
            masses[1:]))
        # in units of I / M, the scale of M dI/dM
        assert (np.abs(d_tab - d_dir) * masses[1:] / direct[j, 1:]).max() < 1e-9


#: measured max relative errors of (rho, p) of the default ("auto") rules, with margin
PERTURBATION_RULE_BOUNDS = {3: 6e-4, 4: 1.5e-4, 5: 2.5e-5, 6: 6e-6, 7: 1.5e-6, 8: 3e-7}


def test_perturbation_quadrature_accuracy_vs_n_q(fd_reference):
    masses, ref = fd_reference
    errors = {}
    for n_q, bound in PERTURBATION_RULE_BOUNDS.items():
        q, w, slope = ncdm.perturbation_quadrature(n_q)
        assert q.shape == w.shape == slope.shape == (n_q,)
        assert np.all(np.diff(q) > 0) and np.all(w > 0)
        assert np.allclose(slope, -q * np.exp(q) / (np.exp(q) + 1), rtol=1e-14)
        got = np.array(ncdm.fd_integrals(masses, (q, w)))
        errors[n_q] = rel(got, ref).max()
        assert errors[n_q] < bound, (n_q, errors[n_q])
    assert errors[8] < errors[5] < errors[3]
    # the plain Gaussian rule is exact for polynomials (number density and massless rho) ...
    q, w, _ = ncdm.perturbation_quadrature(5, method="gauss")
    assert w.sum() == pytest.approx(1.5 * 1.2020569031595942, rel=1e-12)
    assert np.sum(w * q) == pytest.approx(7 * np.pi**4 / 120, rel=1e-12)
    # ... but converges slowly for eps(q) (branch point at q = iM): 5 nodes give ~3e-4
    gauss_err = rel(np.array(ncdm.fd_integrals(masses, (q, w))), ref).max()
    assert 1e-4 < gauss_err < 1e-3


def test_perturbation_quadrature_rejects_bad_input():
    with pytest.raises(ValueError, match="n_q"):
        ncdm.perturbation_quadrature(0)
    with pytest.raises(ValueError, match="n_q"):
        ncdm.perturbation_quadrature(2.5)
    with pytest.raises(ValueError, match="optimised"):
        ncdm.perturbation_quadrature(20, method="optimised")
    with pytest.raises(ValueError, match="method"):
        ncdm.perturbation_quadrature(5, method="simpson")
    q, w, _ = ncdm.perturbation_quadrature(20)  # falls back to Gaussian
    assert q.size == 20


def test_table_with_perturbation_nodes_tracks_background(lcdm):
    """The hierarchy's ncdm background (5 nodes) is within 2.5e-5 of the accurate one at all a."""
    q, w, _ = ncdm.perturbation_quadrature(5)
    a = np.logspace(-10, 0, 200)
    r_acc, p_acc = bg.ncdm_rho_p(lcdm, a)
    r_5, p_5 = bg.ncdm_rho_p(lcdm, a, nodes=(q, w))
    assert rel(r_5, r_acc).max() < 2.5e-5 and rel(p_5, p_acc).max() < 2.5e-5
