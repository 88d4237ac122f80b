"""Thermodynamics against CLASS v3.4.1 (HyRec) reference tables in tests/data.

The tolerances are the measured agreement of RECFAST-class physics with HyRec plus a margin
(docs/thermodynamics.md): x_e within 0.38% of HyRec over 200 < z < 2000 for the main reference
and within 0.52% for the two extra cosmologies of class_thermo_extra.csv (other omega_b,
omega_cdm, h, Y_He, T_cmb; made by generate_thermo_extra.py), asserted at 0.6% / 0.8%; the
issue's requirement is 1%.
"""
import dataclasses
import json

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from boltzmann import reionization as reio
from boltzmann import recombination as rec
from boltzmann import thermodynamics as thermo
from boltzmann.params import CosmoParams
from models.hermite import hermite_interp

DATA = Path(__file__).parent / "data"


def _class_inputs():
    par = yaml.safe_load((DATA / "params.yaml").read_text())
    common = par["class_input"]["common"]
    nu = par["class_input"]["neutrinos"]["massive"]
    return common, nu, par["derived"]["class_massive"]


@pytest.fixture(scope="module")
def reference():
    d = np.loadtxt(DATA / "class_lcdm_thermo.csv", delimiter=",", comments="#")
    cols = ["a", "z", "tau", "x_e", "kappa_dot", "exp_m_kappa", "g", "T_b", "dT_b", "w_b", "cs2", "kappa_b"]
    return {k: d[:, i] for i, k in enumerate(cols)}


@pytest.fixture(scope="module")
def cosmo():
    common, nu, _ = _class_inputs()
    return CosmoParams.make(h=common["h"], omega_b=common["omega_b"], omega_cdm=common["omega_cdm"],
                            n_s=common["n_s"], A_s=common["A_s"], tau_reio=common["tau_reio"],
                            YHe=common["YHe"], T_cmb=common["T_cmb"], N_ur=nu["N_ur"],
                            m_ncdm=(nu["m_ncdm"],))


@pytest.fixture(scope="module")
def table(cosmo):
    return jax.jit(thermo.compute_thermodynamics)(cosmo)


def _rel(table, ref, name, refname):
    lna = jnp.asarray(-np.log1p(ref["z"]))
    return np.asarray(table.interp(name, lna)) / ref[refname] - 1.0


def test_free_electron_fraction_matches_hyrec(table, reference):
    z = reference["z"]
    rel = _rel(table, reference, "x_e", "x_e")
    # measured 0.38% (z ~ 650); with F_H = 1.14 mispaired with the Gaussians it was 1.46% at z = 200
    assert np.abs(rel[(z > 200) & (z < 2000)]).max() < 0.006
    assert np.abs(rel[(z > 800) & (z < 1700)]).max() < 0.005     # CMB-relevant, measured 0.33%
    # He II -> He I, and He III Saha, region
    assert np.abs(rel[(z >= 2000) & (z < 1e4)]).max() < 0.003


def _extra_cases():
    path = DATA / "class_thermo_extra.csv"
    with path.open() as f:
        f.readline()
        meta = json.loads(f.readline().lstrip("# "))
    d = np.loadtxt(path, delimiter=",", comments="#")
    return meta["cases"], d


def test_free_electron_fraction_other_cosmologies():
    """x_e against CLASS-HyRec for two cosmologies not used anywhere else (no tuning to them):
    the recombination physics, not a fit to the main reference, gives the agreement."""
    cases, d = _extra_cases()
    compute = jax.jit(thermo.compute_thermodynamics)
    for i, case in enumerate(cases):
        inp, derived = case["class_input"], case["derived"]
        cosmo = CosmoParams.make(**inp)
        tab = compute(cosmo)
        rows = d[:, 0] == i
        z, x_ref, T_ref = d[rows, 1], d[rows, 2], d[rows, 3]
        lna = jnp.asarray(-np.log1p(z))
        rel = np.asarray(tab.interp("x_e", lna)) / x_ref - 1.0
        # measured 0.30% (case 0) and 0.52% (case 1) over 200 < z < 2000; 0.11% above
        assert np.abs(rel[(z > 200) & (z < 2000)]).max() < 0.008, i
        assert np.abs(rel[(z >= 2000) & (z < 1e4)]).max() < 0.003, i
        rel_T = np.asarray(tab.interp("T_b", lna)) / T_ref - 1.0
        assert np.abs(rel_T[z < 2000]).max() < 0.003, i                 # measured 0.08%
        # RECFAST vs HyRec in the derived redshifts: measured <= 0.21 (z_rec, case 0)
        assert abs(float(tab.z_star) - derived["z_star"]) < 0.3, i
        assert abs(float(tab.z_rec) - derived["z_rec"]) < 0.3, i
        assert abs(float(tab.z_drag) - derived["z_d"]) < 0.3, i
        assert abs(float(tab.tau_star) / derived["tau_star"] - 1) < 1e-3, i
        assert abs(float(tab.z_reio) - derived["z_reio"]) < 0.02, i


def test_fudge_factor_pairing():
    """RECFAST 1.5.2: F_H = 1.14 - 0.015 with the Gaussian K_H correction, 1.14 without it."""
    assert rec.RecombinationSettings().fudge_H_value == pytest.approx(1.125)
    assert rec.RecombinationSettings(gaussian_correction=False).fudge_H_value == pytest.approx(1.14)
    assert rec.RecombinationSettings(fudge_H=1.2).fudge_H_value == 1.2


def test_opacity_is_a_ne_sigmaT_and_consistent(table, reference):
    z = reference["z"]
    rel_k = _rel(table, reference, "kappa_dot", "kappa_dot")
    rel_x = _rel(table, reference, "x_e", "x_e")
    # kappa'/x_e ~ n_H sigma_T a^-2: the constant factor agrees with CLASS to ~1e-4 (m_H, G)
    assert np.abs((1 + rel_k) / (1 + rel_x) - 1).max() < 1e-4
    # the table's columns are mutually consistent
    np.testing.assert_allclose(np.exp(table.ln_kappa_dot), table.kappa_dot, rtol=1e-12)
    np.testing.assert_allclose(table.dln_kappa_dot * table.kappa_dot, table.dkappa_dot, rtol=1e-9)
    np.testing.assert_allclose(table.visibility, table.kappa_dot * table.exp_m_kappa, rtol=1e-12)
    # visibility where it matters (g > 1e-3 max g): measured 0.48%
    g_ref = reference["g"]
    big = g_ref > 1e-3 * g_ref.max()
    rel_g = _rel(table, reference, "visibility", "g")
    assert np.abs(rel_g[big]).max() < 0.01
    assert np.all(np.asarray(table.exp_m_kappa)[np.asarray(table.lna) < -np.log(3000.0)] < 1e-30)


def test_baryon_temperature_and_sound_speed(table, reference):
    z = reference["z"]
    rel_T = _rel(table, reference, "T_b", "T_b")
    assert np.abs(rel_T[z < 2000]).max() < 0.003          # measured 0.07%
    assert np.abs(rel_T[z >= 2000]).max() < 1e-6       # tightly coupled: T_b = T_cmb (1+z)
    rel_c = _rel(table, reference, "cs2", "cs2")
    outside_reio = (z < 2000) & ~((z > 6) & (z < 10))
    assert np.abs(rel_c[outside_reio]).max() < 0.005       # measured 0.15%
    assert np.abs(rel_c[(z > 6) & (z < 10)]).max() < 0.02  # steep x_e step, measured 0.64%: see the docs


def test_derived_redshifts(table):
    _, _, derived = _class_inputs()
    assert abs(float(table.z_reio) - derived["z_reio"]) < 0.02
    # measured -0.012, +0.008, -0.023 (RECFAST 1.5.2 physics vs HyRec)
    assert abs(float(table.z_star) - derived["z_star"]) < 0.1
    assert abs(float(table.z_rec) - derived["z_rec"]) < 0.1
    assert abs(float(table.z_drag) - derived["z_d"]) < 0.1
    assert abs(float(table.tau_star) / derived["tau_star"] - 1) < 1e-3
    assert abs(float(table.tau_drag) / derived["tau_d"] - 1) < 1e-3


def test_ionisation_limits(table, cosmo):
    f_He = float(rec.helium_fraction(cosmo.YHe))
    x = lambda z: float(table.interp("x_e", -np.log1p(z)))  # noqa: E731
    assert x(8000.0) == pytest.approx(1 + 2 * f_He, rel=1e-5)   # H+, He++ : fully ionised (Saha: 4e-6 short)
    assert x(0.0) == pytest.approx(1 + 2 * f_He, rel=1e-4)      # after He II reionisation
    assert x(5.5) == pytest.approx(1 + f_He, rel=2e-3)          # H + first He electron only
    assert x(30.0) < 1e-3                                        # neutral before reionisation


@pytest.fixture(scope="module")
def table_stride2(cosmo):
    return jax.jit(lambda c: thermo.compute_thermodynamics(c, ode_stride=2))(cosmo)


def test_ode_step_nodes():
    # a step per node up to i_stride, then every stride-th node counted back from the last
    nodes = thermo.ode_step_nodes(10, 30, 3, 14)
    assert nodes.tolist() == [10, 11, 12, 13, 14, 17, 20, 23, 26, 29]
    assert thermo.ode_step_nodes(10, 29, 3, 14).tolist() == [10, 11, 12, 13, 14, 16, 19, 22, 25, 28]
    assert thermo.ode_step_nodes(10, 30, 1).tolist() == list(range(10, 30))
    with pytest.raises(ValueError, match="ode_stride"):
        thermo.ode_step_nodes(10, 30, 0)


def test_grid_takes_whole_cells_of_the_largest_step():
    # precision.thermo_ode_step as whole cells of the table grid, at least one: two on the default
    # grid, one on a coarse grid (whose cells exceed the step; two of them made the Newton
    # iterations diverge), four on a grid twice as fine
    from boltzmann import modes
    from boltzmann.params import PrecisionSpec
    assert modes.make_grid(PrecisionSpec()).thermo_stride == 2
    assert modes.make_grid(PrecisionSpec(bg_n_lna=400)).thermo_stride == 1
    assert modes.make_grid(PrecisionSpec(bg_n_lna=8000)).thermo_stride == 4
    assert modes.make_grid(PrecisionSpec(thermo_ode_step=0.001)).thermo_stride == 1


def test_steps_over_two_nodes_stay_close_to_a_step_per_node(table, table_stride2):
    """Two cells per Radau step below z = 3000 (the default precision): the measured changes
    (x_e 6.2e-6, visibility 2.3e-5 and its derivative 6.2e-5 of their peaks, z_rec 1.4e-3) with
    a margin of about three."""
    for name, tol in (("x_e", 2e-5), ("dx_e", 1e-3), ("visibility", 7e-5), ("dvisibility", 2e-4),
                      ("exp_m_kappa", 3e-5), ("cs2", 1e-10)):
        a, b = np.asarray(getattr(table, name)), np.asarray(getattr(table_stride2, name))
        assert np.abs(a - b).max() <= tol * np.abs(a).max(), name
    for name in ("z_rec", "z_star", "z_drag"):
        assert abs(float(getattr(table_stride2, name) - getattr(table, name))) < 6e-3, name
    assert float(table_stride2.z_reio) == pytest.approx(float(table.z_reio), rel=1e-8)


@pytest.mark.parametrize("stride", [1, 2])
def test_hermite_columns_are_derivatives(table, table_stride2, stride):
    """d/dlna columns agree with differences of the value columns (smooth region), with a step
    per node and with the interpolated nodes of two cells per step."""
    table = table if stride == 1 else table_stride2
    lna = np.asarray(table.lna)
    sel = (lna > -np.log(1500.0)) & (lna < -np.log(100.0))
    # central differences carry an O(h^2 f''') error of ~3e-3 for the sharply peaked visibility
    for name, tol in (("x_e", 2e-3), ("T_b", 2e-3), ("cs2", 2e-3), ("visibility", 1e-2)):
        v = np.asarray(getattr(table, name))
        dv = np.asarray(getattr(table, "d" + name))
        central = np.gradient(v, lna)
        scale = np.abs(dv[sel]).max()
        assert np.abs(central[sel] - dv[sel]).max() < tol * scale, name


@pytest.mark.parametrize("config", ["lcdm", "wcdm_heavy_nu"])
def test_hubble_through_the_nodes_matches_the_background(config):
    """The thermodynamics' H(a) -- the cubic Hermite in ln a through ln H and its derivative at
    the table nodes -- equals the background's H between the nodes to 1e-10 relative (the
    massive neutrinos' transition and a w0-wa fluid included), and so does its d ln H/dlna."""
    from boltzmann import background
    from boltzmann.params import load_config

    cosmo = load_config(Path(__file__).parents[1] / "configs" / f"{config}.yaml").cosmology
    lna = jnp.asarray(thermo.default_grid())
    hubble = thermo._hubble_on_nodes(lambda a: background.hubble(cosmo, a), lna)
    # between nodes: the cells' thirds, where a cubic's error is largest
    t = jnp.asarray(np.concatenate([lna[:-1] + (lna[1] - lna[0]) * f for f in (0.3, 0.7)]))

    def log_h(h_of_a):
        return lambda t_: jnp.log(h_of_a(jnp.exp(t_)))

    exact, dexact = jax.jvp(log_h(lambda a: background.hubble(cosmo, a)), (t,), (jnp.ones_like(t),))
    value, dvalue = jax.jvp(log_h(hubble), (t,), (jnp.ones_like(t),))
    assert float(jnp.max(jnp.abs(value - exact))) < 1e-10
    assert float(jnp.max(jnp.abs(dvalue - dexact))) < 1e-8


def test_hermite_interp_exact_for_cubics():
    x = jnp.linspace(-1.0, 2.0, 13)
    f = lambda t: 0.3 * t**3 - t**2 + 2.0 * t - 1.0  # noqa: E731
    df = jax.vmap(jax.grad(f))(x)
    q = jnp.linspace(-1.0, 2.0, 101)
    np.testing.assert_allclose(hermite_interp(x, f(x), df, q), f(q), atol=1e-13)


def test_z_reio_solver_and_implicit_derivative():
    """solve_z_reio inverts tau(z_reio) and its derivative matches finite differences."""
    aH = lambda t: 2e-4 * jnp.exp(-0.5 * t)                         # noqa: E731  matter era, 1/Mpc
    x_before = lambda t: 2e-4 * jnp.ones_like(t)                     # noqa: E731
    f_He = 0.08

    def z_of(tau, amp):
        kdot = lambda t: amp * jnp.exp(-2.0 * t)                     # noqa: E731
        return reio.solve_z_reio(tau, x_before, kdot, aH, f_He)

    amp = 2.3e-7
    z = z_of(0.0544, amp)
    kdot = lambda t: amp * jnp.exp(-2.0 * t)                         # noqa: E731
    assert float(reio.tau_reio_of_z_reio(z, x_before, kdot, aH, f_He)) == pytest.approx(0.0544, rel=1e-10)
    g_tau, g_amp = jax.grad(z_of, argnums=(0, 1))(0.0544, amp)
    eps = 1e-6
    fd_tau = (z_of(0.0544 + eps, amp) - z_of(0.0544 - eps, amp)) / (2 * eps)
    fd_amp = (z_of(0.0544, amp * (1 + eps)) - z_of(0.0544, amp * (1 - eps))) / (2 * eps * amp)
    assert float(g_tau) == pytest.approx(float(fd_tau), rel=1e-5)
    assert float(g_amp) == pytest.approx(float(fd_amp), rel=1e-5)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="fudge_H"):
        rec.RecombinationSettings(fudge_H=2.0)
    with pytest.raises(ValueError, match="n_nodes"):
        thermo.default_grid(10)
    with pytest.raises(ValueError, match="lna_grid"):
        thermo.thermodynamics_from_hubble(lambda a: 1.0 / a**2, 0.022, 0.24, 2.7255, 0.05,
                                          lna_grid=np.array([-10.0, -9.0, -7.5, 0.0]))
    with pytest.raises(ValueError, match="name"):
        thermo.ThermoTable(*([jnp.zeros(3)] * len(thermo.ThermoTable._fields))).interp("nope", 0.0)


def test_loop_shapes_compute_the_same_table(cosmo, table):
    # the accelerators' shape (Newton written out) and the LAPACK form of the small solves are
    # the same arithmetic as the default loops: equal up to rounding and fusion order
    from boltzmann.tables import ACCELERATOR_LOOPS
    lapack = thermo.LoopShape(inline_solves=False)
    for shape in (ACCELERATOR_LOOPS, lapack):
        other = jax.jit(lambda c, shape=shape: thermo.compute_thermodynamics(c, loops=shape))(cosmo)
        for name in ("x_e", "T_b", "cs2", "visibility", "dvisibility", "kappa_dot"):
            a, b = np.asarray(getattr(other, name)), np.asarray(getattr(table, name))
            assert np.abs(a - b).max() <= 1e-10 * np.abs(b).max(), (shape, name)
        for name in ("z_reio", "z_rec", "z_star", "z_drag"):
            assert float(getattr(other, name)) == pytest.approx(float(getattr(table, name)),
                                                                rel=1e-12), (shape, name)
    with pytest.raises(ValueError, match="scan_unroll"):
        thermo.LoopShape(scan_unroll=0)


def test_default_tables_and_tangents_call_no_lapack(cosmo):
    # batched LAPACK calls (vmap over cosmologies, over the Radau steps of the tangent) share
    # XLA:CPU's thread pool and deadlocked the 2-core CPU when two ran at once: the default
    # thermodynamics and its jvp, batched over cosmologies, must lower without any
    def x_e_and_tangent(omega_b):
        def x_e(wb):
            return thermo.compute_thermodynamics(dataclasses.replace(cosmo, omega_b=wb)).x_e
        return jax.jvp(x_e, (omega_b,), (jnp.ones_like(omega_b),))

    batch = jnp.full((2,), float(cosmo.omega_b))
    text = jax.jit(jax.vmap(x_e_and_tangent)).lower(batch).as_text()
    assert "lapack" not in text.lower()
    lapack = jax.jit(jax.vmap(lambda wb: thermo.compute_thermodynamics(
        dataclasses.replace(cosmo, omega_b=wb), loops=thermo.LoopShape(inline_solves=False)).x_e))
    assert "lapack" in lapack.lower(batch).as_text().lower()    # the check sees them
