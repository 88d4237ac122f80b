"""CMB spectra (boltzmann.cmb): the pieces against exact results, the output contract, and the
spectra against CLASS v3.4.1 (tests/data/class_cl.csv, made by tests/data/generate_cl.py).

Default tests: Bessel table, line-of-sight integrals of analytic sources, the Sachs-Wolfe
plateau of the C_ℓ integral, the ℓ spline, the observables the sources use, configuration and
cl.csv. ``-m slow``: the full chain against CLASS for ℓ ≤ 2500.
"""
import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import spherical_jn

from boltzmann import output
from boltzmann.cmb import ClSpectra
from boltzmann.cmb import bessel
from boltzmann.cmb.line_of_sight import Transfers, transfer_functions
from boltzmann.cmb.sampling import (ClSampling, TransferWindow, multipoles,
                                    source_wavenumbers, spline_matrix, transfer_wavenumbers,
                                    transfer_window)
from boltzmann.cmb.sources import SourceGrid
from boltzmann.cmb.spectra import cl_from_transfers, ell_spline_matrix
from boltzmann.params import ConfigError, load_config

DATA = Path(__file__).parent / "data"
COSMO = {"h": 0.6736, "omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9, "n_s": 0.9649,
         "tau_reio": 0.0544}


# ------------------------------------------------------------------ Bessel functions
def test_bessel_table_matches_scipy():
    ells = np.array([2, 3, 17, 150, 700])
    table = bessel.BesselTable.build(ells, 1200.0, dx=0.1)
    rng = np.random.default_rng(3)
    for il, ell in enumerate(ells):
        x = np.sort(rng.uniform(0.0, 1200.0, 400))
        j, dj, d2j, jx2 = (np.asarray(v) for v in bessel.values(table, il, jnp.asarray(x)))
        ref = spherical_jn(ell, x)
        dref = spherical_jn(ell, x, derivative=True)
        amp = max(np.abs(ref).max(), 1e-3)
        assert np.max(np.abs(j - ref)) < 1e-6 * amp, ell
        assert np.max(np.abs(dj - dref)) < 1e-5 * amp, ell
        safe = x > 1.0
        d2ref = -2 / x[safe] * dref[safe] - (1 - ell * (ell + 1) / x[safe] ** 2) * ref[safe]
        assert np.max(np.abs(d2j[safe] - d2ref)) < 1e-5 * amp, ell
        assert np.allclose(jx2[safe] * x[safe] ** 2, j[safe], rtol=1e-12, atol=1e-14)


def test_bessel_lookup_derivatives_in_x_are_the_exact_ones():
    """The lookups' jvp in x (written out, not traced): d/dx of (j, j', j'', j/x²) against
    scipy's j_ℓ', the exact j_ℓ'' and j_ℓ''' (from Bessel's equation) and (j/x²)' to the
    table's interpolation error; ``j_only``'s tangent is ``values``' j' tangent; reverse mode
    gives the same numbers."""
    ells = np.array([2, 3, 40, 700])
    table = bessel.BesselTable.build(ells, 1000.0, dx=0.1)
    rng = np.random.default_rng(5)
    for il, ell in enumerate(ells):
        x = np.sort(rng.uniform(1.0, 1000.0, 300))
        xs = jnp.asarray(x)
        _, (dj, d2j, d3j, djx2) = jax.jvp(lambda u: bessel.values(table, il, u), (xs,),
                                           (jnp.ones_like(xs),))
        L = ell * (ell + 1.0)
        j, j1 = spherical_jn(ell, x), spherical_jn(ell, x, derivative=True)
        j2 = -2 / x * j1 - (1 - L / x ** 2) * j
        j3 = 2 / x ** 2 * j1 - 2 / x * j2 - 2 * L / x ** 3 * j - (1 - L / x ** 2) * j1
        amp = max(np.abs(j).max(), 1e-3)
        for got, ref in ((dj, j1), (d2j, j2), (d3j, j3), (djx2, j1 / x ** 2 - 2 * j / x ** 3)):
            assert np.max(np.abs(np.asarray(got) - ref)) < 1e-5 * amp, ell
        _, dj_only = jax.jvp(lambda u: bessel.j_only(table, il, u), (xs,), (jnp.ones_like(xs),))
        np.testing.assert_allclose(np.asarray(dj_only), np.asarray(dj), rtol=0, atol=1e-12 * amp)
        grad = jax.grad(lambda u: jnp.sum(bessel.values(table, il, u)[2]))(xs)
        np.testing.assert_array_equal(np.asarray(grad), np.asarray(d3j))


def test_bessel_table_cache_reuses_a_table_within_its_bucket():
    """Two x_max in one bucket share one table; its values equal a fresh build's wherever
    both are defined, and a table from another bucket is a different object."""
    ells = np.array([2, 40, 300])
    a = bessel.BesselTable.cached(ells, 610.0)
    b = bessel.BesselTable.cached(ells, 640.0)
    assert a is b and a.x_max >= 640.0
    fresh = bessel.BesselTable.build(ells, 610.0)
    n = fresh.j.shape[1]
    np.testing.assert_array_equal(np.asarray(a.j)[:, :n - 2], np.asarray(fresh.j)[:, :n - 2])
    x = jnp.linspace(0.0, 609.0, 301)
    for il in range(ells.size):
        for u, v in zip(bessel.values(a, il, x), bessel.values(fresh, il, x)):
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=0, atol=1e-15)
    assert bessel.BesselTable.cached(ells, 610.0 + bessel.X_BUCKET) is not a


def test_bessel_table_store_serves_a_new_process_and_rebuilds_a_corrupt_entry(tmp_path,
                                                                             monkeypatch):
    """With a persistent cache (runtime.configure), a table is stored once; a process that has
    not built it (the in-memory cache cleared) loads it without calling scipy; a corrupted or
    truncated entry is rebuilt and replaced; without a cache nothing is written."""
    from boltzmann import runtime

    ells = np.array([2, 50, 400])
    monkeypatch.setattr(runtime, "_configured_root", tmp_path)
    bessel._TABLES.clear()
    a = bessel.BesselTable.cached(ells, 700.0)
    (entry,) = (tmp_path / runtime.TABLES_DIR).glob("bessel-*.npz")
    bessel._TABLES.clear()
    build = bessel.BesselTable.build

    def no_build(*args, **kwargs):
        raise AssertionError("built again instead of loaded")

    monkeypatch.setattr(bessel.BesselTable, "build", no_build)
    b = bessel.BesselTable.cached(ells, 700.0)
    np.testing.assert_array_equal(np.asarray(b.j), np.asarray(a.j))
    np.testing.assert_array_equal(np.asarray(b.dj), np.asarray(a.dj))
    monkeypatch.setattr(bessel.BesselTable, "build", build)
    for damage in (b"not a table", entry.read_bytes()[:1000]):
        entry.write_bytes(damage)
        bessel._TABLES.clear()
        c = bessel.BesselTable.cached(ells, 700.0)
        np.testing.assert_array_equal(np.asarray(c.j), np.asarray(a.j))
        with np.load(entry) as f:           # replaced by a readable entry
            assert f["j"].shape == np.asarray(a.j).shape
    monkeypatch.setattr(runtime, "_configured_root", None)
    bessel._TABLES.clear()
    bessel.BesselTable.cached(np.array([2, 60]), 300.0)
    assert len(list((tmp_path / runtime.TABLES_DIR).glob("bessel-*.npz"))) == 1
    bessel._TABLES.clear()


def test_turning_point_is_below_the_function():
    for ell in (2, 10, 100, 1000, 3000):
        x0 = bessel.turning_point(ell)
        x = np.linspace(0.0, x0, 50)[1:]
        assert np.all(np.abs(spherical_jn(ell, x)) < 1e-10), ell


# ------------------------------------------------------------------ line of sight
def _gaussian_sources(k, tau0=1000.0, tau_c=300.0, width=20.0):
    """A fake SourceGrid: S_0 = Gaussian in τ, S_1 = its k-independent twin, S_2 = S_E = 0."""
    tau = np.linspace(100.0, tau0, 9001)
    gauss = np.exp(-0.5 * ((tau - tau_c) / width) ** 2)
    ones = np.ones((k.size, 1))
    s = jnp.asarray(ones * gauss[None, :])
    zero = jnp.zeros_like(s)
    return SourceGrid(k=k, tau=jnp.asarray(tau), x=-np.log(tau0 / tau) * 2, tau0=tau0,
                      tau_rec=tau_c, t0=s, t1=0.5 * s, t2=0.25 * s, e=s, phi=zero,
                      status=np.zeros(k.size, int), n_accepted=np.zeros(k.size, int))


def test_line_of_sight_of_analytic_sources():
    k_src = np.linspace(0.01, 0.2, 12)
    src = _gaussian_sources(k_src)
    ells = np.array([2, 10, 60])
    k = np.array([0.02, 0.07, 0.15])
    table = bessel.BesselTable.build(ells, float(k[-1] * src.tau0) + 1.0, dx=0.05)
    tr = transfer_functions(src, ells, k, table, l_late=1000, late_cut_tau=src.tau0,
                            l_limber=2)
    for il, ell in enumerate(ells):
        for ik, kk in enumerate(k):
            def g(t):
                return math.exp(-0.5 * ((t - 300.0) / 20.0) ** 2)

            def integrand_t(t):
                x = kk * (1000.0 - t)
                j = spherical_jn(ell, x)
                dj = spherical_jn(ell, x, derivative=True)
                d2j = -2 / x * dj - (1 - ell * (ell + 1) / x ** 2) * j
                return g(t) * (j + 0.5 * dj + 0.25 * d2j)

            def integrand_e(t):
                x = kk * (1000.0 - t)
                return g(t) * spherical_jn(ell, x) / x ** 2

            want_t = quad(integrand_t, 100.0, 600.0, limit=400, epsabs=1e-13)[0]
            want_e = quad(integrand_e, 100.0, 600.0, limit=400, epsabs=1e-15)[0] * math.sqrt(
                (ell + 2) * (ell + 1) * ell * (ell - 1))
            assert float(tr.T[il, ik]) == pytest.approx(want_t, rel=1e-5, abs=1e-8)
            assert float(tr.E[il, ik]) == pytest.approx(want_e, rel=1e-5, abs=1e-10)


def test_moved_windows_reuse_the_compiled_line_of_sight():
    """The multipoles' k windows move with the cosmology (τ0, τ_rec): they are arguments of the
    line of sight's compiled program, not part of it, so windows that moved but kept their
    widths compile nothing new; each row is the whole-grid row kept on its own window."""
    from boltzmann.cmb import line_of_sight as los

    src = _gaussian_sources(np.linspace(0.01, 0.2, 12))
    ells = np.array([2, 10, 60])
    k = np.linspace(0.02, 0.15, 8)
    table = bessel.BesselTable.build(ells, float(k[-1] * src.tau0) + 1.0, dx=0.05)
    opts = dict(l_late=1000, late_cut_tau=src.tau0, l_limber=2)
    whole = transfer_functions(src, ells, k, table, **opts)
    windows = [TransferWindow(lo=np.array([0, 1, 2]), hi=np.array([4, 5, 6])),
               TransferWindow(lo=np.array([1, 2, 4]), hi=np.array([5, 6, 8]))]
    rows = [transfer_functions(src, ells, k, table, window=windows[0], **opts)]
    compiled = los._program._cache_size()
    rows.append(transfer_functions(src, ells, k, table, window=windows[1], **opts))
    assert los._program._cache_size() == compiled
    for tr, w in zip(rows, windows):
        for il in range(ells.size):
            keep = (np.arange(k.size) >= w.lo[il]) & (np.arange(k.size) < w.hi[il])
            for name in ("T", "E"):
                np.testing.assert_allclose(np.asarray(getattr(tr, name))[il],
                                           np.where(keep, np.asarray(getattr(whole, name))[il],
                                                    0.0), rtol=1e-12, atol=0)


def test_line_of_sight_groups_do_not_change_the_transfers():
    """The multipoles are integrated in groups (with φ for ℓ ≤ l_limber, without it up to
    l_late, early times only above): where a multipole falls changes only what is computed
    for it — Δ^T, Δ^E of every ℓ are the same whatever l_limber is, and Δ^φ of an ℓ ≤ l_limber
    is the same whichever group held it; l_limber above l_late is refused."""
    k_src = np.linspace(0.01, 0.2, 12)
    src = _gaussian_sources(k_src)
    src = dataclasses.replace(src, phi=src.t0 * 0.3)
    ells = np.array([2, 10, 60, 200])
    k = np.array([0.02, 0.07, 0.15])
    table = bessel.BesselTable.build(ells, float(k[-1] * src.tau0) + 1.0, dx=0.05)
    trs = [transfer_functions(src, ells, k, table, l_late=100, late_cut_tau=500.0, l_limber=lim)
           for lim in (2, 10, 60)]
    for tr in trs[1:]:
        np.testing.assert_allclose(np.asarray(tr.T), np.asarray(trs[0].T), rtol=1e-13, atol=0)
        np.testing.assert_allclose(np.asarray(tr.E), np.asarray(trs[0].E), rtol=1e-13, atol=0)
    assert [tr.ells_p.tolist() for tr in trs] == [[2], [2, 10], [2, 10, 60]]
    np.testing.assert_allclose(np.asarray(trs[2].P)[:2], np.asarray(trs[1].P), rtol=1e-13)
    assert float(np.abs(np.asarray(trs[2].P)).max()) > 0.0
    with pytest.raises(ValueError, match="l_limber must not exceed l_late"):
        transfer_functions(src, ells, k, table, l_late=10, l_limber=60)


def test_windowed_transfers_are_the_whole_ones_on_each_window():
    """A multipole's Δ^T, Δ^E integrated over its window of the k grid equal the whole grid's
    there and are zero elsewhere (whatever the widest window of its group); Δ^φ on every
    third wavenumber (and the last) equals the whole grid's on those."""
    src = _gaussian_sources(np.linspace(0.01, 0.2, 12))
    src = dataclasses.replace(src, phi=src.t0 * 0.3)
    ells = np.array([2, 10, 60, 100])
    k = np.linspace(0.012, 0.19, 40)
    table = bessel.BesselTable.build(ells, float(k[-1] * src.tau0) + 1.0, dx=0.05)
    window = TransferWindow(lo=np.array([0, 5, 12, 28]), hi=np.array([10, 30, 25, 36]),
                            phi_stride=3)
    kw = dict(l_late=100, late_cut_tau=500.0, l_limber=60)
    whole = transfer_functions(src, ells, k, table, **kw)
    part = transfer_functions(src, ells, k, table, window=window, **kw)
    for il in range(ells.size):
        inside = np.zeros(k.size, bool)
        inside[window.lo[il]:window.hi[il]] = True
        for name in ("T", "E"):
            got, want = np.asarray(getattr(part, name))[il], np.asarray(getattr(whole, name))[il]
            np.testing.assert_allclose(got[inside], want[inside], rtol=1e-13, atol=0)
            assert np.all(got[~inside] == 0.0) and np.any(want[~inside] != 0.0)
    ip = window.phi_indices(k.size)
    assert ip[0] == 0 and ip[-1] == k.size - 1 and np.max(np.diff(ip)) == 3
    np.testing.assert_array_equal(part.k_p, k[ip])
    np.testing.assert_allclose(np.asarray(part.P), np.asarray(whole.P)[:, ip], rtol=1e-13)
    with pytest.raises(ValueError, match="one entry per multipole"):
        transfer_functions(src, ells, k, table, window=TransferWindow.whole(3, k.size), **kw)


def test_multipoles_per_iteration_do_not_change_the_transfers(monkeypatch):
    """The line of sight's loops may take several multipoles per iteration when asked: Δ^T, Δ^E,
    Δ^φ are the same for any batch, uneven ones included; ``multipole_batch``, the default, is 1
    on every backend (on an H200 a batch of 8 doubled the line of sight's time)."""
    from boltzmann.cmb import line_of_sight as los

    src = _gaussian_sources(np.linspace(0.01, 0.2, 12))
    src = dataclasses.replace(src, phi=src.t0 * 0.3)
    ells = np.array([2, 10, 60, 100, 150])
    k = np.linspace(0.012, 0.19, 40)
    table = bessel.BesselTable.build(ells, float(k[-1] * src.tau0) + 1.0, dx=0.05)
    window = TransferWindow(lo=np.array([0, 5, 12, 28, 30]), hi=np.array([10, 30, 25, 36, 40]),
                            phi_stride=3)
    kw = dict(l_late=100, late_cut_tau=500.0, l_limber=60, window=window)
    one = transfer_functions(src, ells, k, table, batch=1, **kw)
    for batch in (3,):          # uneven: the four multipoles ℓ ≤ l_late in 3 + 1
        other = transfer_functions(src, ells, k, table, batch=batch, **kw)
        for name in ("T", "E", "P"):
            np.testing.assert_allclose(np.asarray(getattr(other, name)),
                                       np.asarray(getattr(one, name)), rtol=1e-13, atol=1e-300)
    assert los.multipole_batch(4900, 1074) == 1                 # this CPU
    monkeypatch.setattr(los.jax, "default_backend", lambda: "gpu")
    assert los.multipole_batch(4900, 1074) == 1
    assert los.multipole_batch(10, 10, copies=3) == 1


def test_line_of_sight_jvp_is_the_traced_one():
    """The line of sight's own jvp (``_line_of_sight_jvp``: one pass, shared Bessel values)
    equals the jvp traced through its arithmetic, along the sources, the source times and τ0
    at once, for Δ^T, Δ^E (both groups) and Δ^φ, and under vmap over directions."""
    from boltzmann.cmb import line_of_sight as los

    src = _gaussian_sources(np.linspace(0.01, 0.2, 12))
    src = dataclasses.replace(src, phi=src.t0 * 0.3,
                              t2=src.t0 * (0.2 + src.tau[None, :] / 3000.0))
    ells = np.array([2, 10, 60, 100, 150])
    k = np.linspace(0.012, 0.19, 40)
    table = bessel.BesselTable.build(ells, float(k[-1] * src.tau0) + 30.0, dx=0.05)
    window = TransferWindow(lo=np.array([0, 5, 12, 28, 30]), hi=np.array([10, 30, 25, 36, 40]),
                            phi_stride=3)
    plan = los.plan_of(ells, k, table, src.tau.shape[0], 6000, l_late=100, l_limber=60,
                       window=window, batch=None)
    fine = los.fine_sources(src, k)
    primals = (jnp.asarray(src.tau), jnp.asarray(src.tau0, jnp.float64), fine)
    rng = np.random.default_rng(0)
    tangents = (jnp.asarray(rng.normal(size=(2,) + src.tau.shape) * 0.01 + 0.5),
                jnp.asarray([0.7, -0.3]),
                {n: jnp.asarray(rng.normal(size=(2,) + v.shape)) * v for n, v in fine.items()})
    fixed = (table.j, table.dj, jnp.asarray(k))
    groups = (los._group_arrays(plan.late), los._group_arrays(plan.early))

    def jvps(fn):
        def one(*t):
            return jax.jvp(lambda a, b, c: fn(plan.shape, *fixed, a, b, c, *groups), primals, t)
        return jax.vmap(one, out_axes=(None, 0))(*tangents)

    (values, dots), (want_values, want_dots) = jvps(los._line_of_sight), \
        jvps(los._line_of_sight.fun)
    for got, want in zip(values + dots, want_values + want_dots):
        scale = float(jnp.max(jnp.abs(want)))
        assert scale > 0.0
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                                   atol=1e-13 * scale)


def test_transfer_window_bounds():
    """The window starts where j_ℓ(kχ) is still negligible at the largest distance χ_max and
    ends at the first k beyond ℓ/χ_rec + k_window_extra; without the extra it is the whole grid
    up from the turning point; at the default sampling it is well under half the grid."""
    tau0, chi_rec, chi_max = 14175.0, 13895.0, 13945.0
    k = transfer_wavenumbers(source_wavenumbers(4000, tau0, 145.0), tau0)
    ells = multipoles(4000)
    times = ([tau0 - chi_max], tau0, tau0 - chi_rec)     # first source, today, last scattering
    win = transfer_window(ells, k, *times)
    for il in range(0, ells.size, 10):
        if win.lo[il] > 0:
            assert abs(spherical_jn(int(ells[il]), k[win.lo[il]] * chi_max)) < 1e-10
        top = ells[il] / chi_rec + ClSampling().k_window_extra
        assert k[win.hi[il] - 1] <= top and (win.hi[il] == k.size or k[win.hi[il]] > top)
    assert np.max(win.hi - win.lo) < 0.5 * k.size
    assert win.phi_stride == ClSampling().phi_k_stride
    no_cap = transfer_window(ells, k, *times,
                             dataclasses.replace(ClSampling(), k_window_extra=None))
    assert np.all(no_cap.hi == k.size) and np.array_equal(no_cap.lo, win.lo)


def test_sachs_wolfe_plateau():
    """Δ_ℓ = j_ℓ(kχ)/3 and a scale-invariant P_R give ℓ(ℓ+1)C_ℓ/2π = A_s/9 (times T_cmb²)."""
    chi, A_s = 14000.0, 2e-9
    k = np.exp(np.linspace(np.log(1e-6), np.log(0.05), 20000))
    ells = np.array([2, 5, 20])
    delta = np.stack([spherical_jn(ell, k * chi) / 3.0 for ell in ells])
    tr = Transfers(ells=ells, k=k, T=jnp.asarray(delta), E=jnp.asarray(delta), ells_p=ells[:0],
                   P=None)
    cl = cl_from_transfers(tr, A_s, 1.0, 0.05, T_cmb=1e-6)
    d = ells * (ells + 1) / (2 * np.pi) * np.asarray(cl["TT"])
    np.testing.assert_allclose(d, A_s / 9.0, rtol=2e-3)


def test_ell_sampling_and_spline():
    ells = multipoles(2500)
    assert ells[0] == 2 and ells[-1] == 2500 and np.all(np.diff(ells) > 0)
    assert np.all(np.diff(ells) <= ClSampling().l_linstep)
    assert set(range(2, 31)) <= set(ells.tolist())
    m = ell_spline_matrix(ells, 2500)
    ell_all = np.arange(2, 2501)
    f = lambda l: 1.0 + 0.3 * np.cos(2 * np.pi * l / 300.0) * np.exp(-l / 1500.0)  # noqa: E731
    assert np.max(np.abs(m @ f(ells) - f(ell_all))) < 3e-4


def test_ell_spline_is_taken_apart_at_a_change_of_method():
    """Where the computation changes method (late sources dropped above ℓ = 400, Limber's
    C_ℓ^φφ above ℓ = 100) C_ℓ has a small step: the run samples both sides of it
    (``sampled_multipoles``) and the spline, taken apart there, keeps the step where it is. One
    spline across it spreads the step over the neighbouring multipoles (what the ℓ-refined
    convergence run measured: 2e-4 in TT near ℓ = 400)."""
    from boltzmann.cmb.stage import L_LATE, L_LIMBER, method_breaks, sampled_multipoles

    ells = sampled_multipoles(2500)
    assert {L_LIMBER, L_LIMBER + 1, L_LATE, L_LATE + 1} <= set(ells.tolist())
    assert set(multipoles(2500).tolist()) <= set(ells.tolist())
    assert method_breaks(2500) == {"TT": (L_LATE,), "EE": (L_LATE,), "TE": (L_LATE,),
                                   "PP": (L_LIMBER,)}
    assert method_breaks(300)["TT"] == () and method_breaks(80)["PP"] == ()
    ell_all = np.arange(2, 2501)
    f = lambda l: (1.0 + 0.3 * np.cos(2 * np.pi * l / 300.0) * np.exp(-l / 1500.0)  # noqa: E731
                   + 2e-4 * (l > L_LATE))
    apart = ell_spline_matrix(ells, 2500, breaks=(L_LATE,))
    across = ell_spline_matrix(ells, 2500)
    assert np.max(np.abs(apart @ f(ells) - f(ell_all))) < 2e-5
    assert np.max(np.abs(across @ f(ells) - f(ell_all))) > 3e-5
    smooth = lambda l: 1.0 + 0.3 * np.cos(2 * np.pi * l / 300.0) * np.exp(-l / 1500.0)  # noqa
    assert np.max(np.abs(apart @ smooth(ells) - smooth(ell_all))) < 2e-5   # quintic pieces
    with pytest.raises(ValueError, match="needs ℓ = 400 and 401 sampled"):
        ell_spline_matrix(multipoles(2500), 2500, breaks=(400,))


def test_every_ell_keeps_its_matrices_concrete():
    """``every_ell`` keeps its spline matrices between calls (they depend on no cosmology); a
    first call inside ``jax.jit`` (``ClFunction``'s programs) must not leave a tracer in that
    cache: the traced and the eager results agree, and the kept matrices are arrays."""
    from boltzmann.cmb import stage

    stage._ELL_MATRICES.clear()
    ells = stage.sampled_multipoles(700)
    rng = np.random.default_rng(1)
    sampled = {n: jnp.asarray(rng.random(ells.size) + 1.0) for n in ("TT", "PP")}
    traced = jax.jit(lambda s: stage.every_ell(s, ells, 700, ["TT", "PP"]))(sampled)
    kept = stage._ELL_MATRICES.values()
    assert len(kept) == 2 and not any(isinstance(m, jax.core.Tracer) for m in kept)
    eager = stage.every_ell(sampled, ells, 700, ["TT", "PP"])
    assert len(stage._ELL_MATRICES.values()) == 2
    for n in ("TT", "PP"):
        np.testing.assert_allclose(traced[n], eager[n], rtol=1e-14)
        ref = ell_spline_matrix(ells, 700, breaks=stage.method_breaks(700)[n]) @ (
            ells * (ells + 1.0) * np.asarray(sampled[n]))
        ell_all = np.arange(2, 701)
        np.testing.assert_allclose(eager[n], ref / (ell_all * (ell_all + 1.0)), rtol=1e-13)


def test_banded_k_spline_equals_the_spline_matrix():
    """The line of sight's banded spline in ln k is ``spline_matrix``'s operator: the same matrix
    to rounding, the same values on a (K, S) block of sources; targets outside the source grid
    are refused."""
    from boltzmann.cmb.k_spline import BandedSpline

    k_from = np.concatenate([np.logspace(-5, -2, 40), np.linspace(0.0105, 0.4, 60)])
    k_to = np.concatenate([[k_from[0]], np.sort(np.random.default_rng(2).uniform(
        k_from[0], k_from[-1], 700)), [k_from[-1]]])
    for degree in (3, 5):
        band = BandedSpline.build(k_from, k_to, degree)
        dense = spline_matrix(k_from, k_to, degree)
        assert band.basis.shape == (k_to.size, degree + 1)
        as_matrix = np.asarray(band.apply(jnp.eye(k_from.size)))
        np.testing.assert_allclose(as_matrix, dense, rtol=0, atol=1e-13 * np.abs(dense).max())
        v = np.random.default_rng(3).standard_normal((k_from.size, 9))
        np.testing.assert_allclose(np.asarray(band.apply(jnp.asarray(v))), dense @ v, rtol=0,
                                   atol=1e-12 * np.abs(dense @ v).max())
    with pytest.raises(ValueError, match="outside the source grid"):
        BandedSpline.build(k_from, np.array([0.5 * k_from[0], 0.1]), 5)


def test_wavenumber_grids():
    tau0, r_s = 14175.0, 145.0
    ks = source_wavenumbers(2500, tau0, r_s)
    assert ks[0] == pytest.approx(0.1 / tau0) and ks[-1] <= 2.0 * 2500 / tau0 * (1 + 1e-12)
    assert np.all(np.diff(ks) > 0)
    kt = transfer_wavenumbers(ks, tau0)
    assert kt[0] == ks[0] and kt[-1] <= ks[-1]
    assert np.max(np.diff(kt)) <= 0.25 * 2 * np.pi / tau0 * (1 + 1e-9)


# ------------------------------------------------------------------ lensing
def test_wigner_d_recurrence():
    from scipy.special import eval_legendre, lpmv

    from boltzmann.cmb.lensing import PAIRS, _scan_d, wigner_d_start

    beta = np.linspace(0.01, 3.1, 7)

    def keep(carry, ell, d):
        return carry, jnp.stack([d[p] for p in PAIRS])

    _, ds = _scan_d(beta, 59, keep, 0.0)
    ds = np.asarray(ds)
    d = {p: ds[:, i] for i, p in enumerate(PAIRS)}
    x = np.cos(beta)
    for ell in range(0, 60):
        np.testing.assert_allclose(d[(0, 0)][ell], eval_legendre(ell, x), atol=1e-12)
        if ell >= 4:   # d^ℓ_{m0} = sqrt((ℓ-m)!/(ℓ+m)!) P_ℓ^m(cos β) (Condon-Shortley phase)
            for m in (2, 4):
                f = np.sqrt(np.prod(1.0 / np.arange(ell - m + 1, ell + m + 1)))
                np.testing.assert_allclose(d[(m, 0)][ell], f * lpmv(m, ell, x), atol=1e-11)
        if ell < 3:
            assert np.all(d[(3, 1)][ell] == 0) and np.all(d[(4, -4)][ell] == 0)
    np.testing.assert_allclose(d[(2, 2)][2], ((1 + x) / 2) ** 2, atol=1e-14)
    np.testing.assert_allclose(d[(2, -2)][2], ((1 - x) / 2) ** 2, atol=1e-14)
    np.testing.assert_allclose(d[(1, 1)][1], (1 + x) / 2, atol=1e-14)
    assert np.allclose(wigner_d_start(1, -1, beta), (1 - np.cos(beta)) / 2)


def test_lensing_against_class():
    """CLASS's unlensed spectra (class_cl.csv, splined to every ℓ ≤ 2500) lensed to ℓ = 1500
    against CLASS's lensed ones."""
    from scipy.interpolate import CubicSpline

    from boltzmann.cmb.lensing import lensed_spectra

    ref = np.loadtxt(DATA / "class_cl.csv", delimiter=",")
    ell_r = ref[:, 0]
    ell = np.arange(2, 2501)
    f = ell * (ell + 1.0) / (2 * np.pi)
    cl = {name: CubicSpline(ell_r, ref[:, c])(ell) / f for name, c in
          (("TT", 1), ("EE", 2), ("TE", 3))}
    cl["PP"] = CubicSpline(ell_r, ref[:, 4])(ell) / (f * ell * (ell + 1.0))
    out = lensed_spectra(ell, cl, 1500, n_beta=3000)
    sel = ell_r <= 1500
    e = ell_r[sel].astype(int)
    fe = e * (e + 1.0) / (2 * np.pi)
    # BB sums EE and φφ up to high ℓ: with the input stopping 1000 above, it is 5e-3 low at
    # ℓ = 1000 and 2 % at 1500 (docs/cmb.md), so it is checked to ℓ = 1000
    for name, c, tol, top in (("TT", 5, 1e-3, 1500), ("EE", 6, 1e-3, 1500), ("BB", 8, 1e-2, 1000)):
        rel = (fe * out[name][e - 2] / ref[sel, c] - 1.0)[e <= top]
        assert np.max(np.abs(rel)) < tol, (name, np.max(np.abs(rel)))
    te = (fe * out["TE"][e - 2] - ref[sel, 7]) / np.sqrt(ref[sel, 5] * ref[sel, 6])
    assert np.max(np.abs(te)) < 1e-3


def test_lensing_tables_equal_the_recurrence():
    """The Wigner tables (one reduction per pass over the (ℓ, β) plane) and the ℓ scans give the
    same lensed spectra to rounding; the process keeps one table per (ℓ_in, n_β); a traced
    call with tables and an unknown method are refused with what to use instead."""
    from scipy.interpolate import CubicSpline

    from boltzmann.cmb import lensing

    ref = np.loadtxt(DATA / "class_cl.csv", delimiter=",")
    ell = np.arange(2, 901)
    f = ell * (ell + 1.0) / (2 * np.pi)
    cl = {name: CubicSpline(ref[:, 0], ref[:, c])(ell) / f for name, c in
          (("TT", 1), ("EE", 2), ("TE", 3))}
    cl["PP"] = CubicSpline(ref[:, 0], ref[:, 4])(ell) / (f * ell * (ell + 1.0))
    rec = lensing.lensed_spectra(ell, cl, 400, n_beta=1300, method="recurrence")
    tab = lensing.lensed_spectra(ell, cl, 400, n_beta=1300, method="tables")
    for name in ("TT", "EE", "TE", "BB"):
        x, y = np.asarray(tab[name]), np.asarray(rec[name])
        assert x.shape == (399,)
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-11 * np.max(np.abs(y)))
    # the lensing correction itself (not only the unlensed part) agrees
    delta = np.asarray(tab["TT"]) - cl["TT"][:399]
    np.testing.assert_allclose(delta, np.asarray(rec["TT"]) - cl["TT"][:399], rtol=0,
                               atol=1e-9 * np.max(np.abs(delta)))
    table = lensing.WignerTables.cached(900, 1300)
    assert table is lensing.WignerTables.cached(900, 1300)
    assert table.d.shape == (901, len(lensing.PAIRS), 1300)
    x = np.cos(np.arccos(np.sort(np.polynomial.legendre.leggauss(1300)[0])))
    np.testing.assert_allclose(np.asarray(table.pairs()[(0, 0)][1]), x, atol=1e-12)
    # traced: the table as an argument of the program; tangents as the recurrence's
    d_tt = cl["TT"] * np.linspace(0.5, 1.5, ell.size)

    def lensed_tt(t, wigner):
        return lensing.lensed_spectra(ell, dict(cl, TT=t), 400, n_beta=1300,
                                      method="recurrence", wigner=wigner)["TT"]

    v_rec, t_rec = jax.jvp(lambda t: lensed_tt(t, None), (cl["TT"],), (d_tt,))
    v_tab, t_tab = jax.jit(lambda t, w: jax.jvp(lambda u: lensed_tt(u, w), (t,), (d_tt,)))(
        cl["TT"], table.d)
    np.testing.assert_allclose(np.asarray(v_tab), np.asarray(v_rec), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(t_tab), np.asarray(t_rec), rtol=0,
                               atol=1e-11 * np.max(np.abs(np.asarray(t_rec))))
    with pytest.raises(ValueError, match="does not serve unlensed spectra to 900"):
        lensing.lensed_spectra(ell, cl, 400, wigner=table.d[:500])
    with pytest.raises(ValueError, match="method='recurrence' inside jit"):
        jax.jit(lambda t: lensing.lensed_spectra(ell, dict(cl, TT=t), 400, n_beta=1300,
                                                 method="tables")["TT"])(cl["TT"])
    with pytest.raises(ValueError, match="method must be one of"):
        lensing.lensed_spectra(ell, cl, 400, method="fft")


# ------------------------------------------------------------------ model observables
def test_source_observables_are_consistent():
    from models.eb import build_eb_model
    from models.tables import pack_table, uniform_grid

    model = build_eb_model(l_max_g=6, l_max_pol_g=5, l_max_ur=6)
    rng = np.random.default_rng(5)
    xg, dx = uniform_grid(-3.0, 0.5, 8)
    cols = {c: (rng.uniform(-1.0, 1.0, xg.size), rng.uniform(-1.0, 1.0, xg.size))
            for c in model.table_columns}
    tab = pack_table(cols, model.table_columns)[None]
    p = model.make_params(k=0.3, cosmo_row=0.0, table_x_min=-3.0, table_dx=dx, rho_g0=0.8,
                          rho_b0=0.5, rho_cdm0=1.3, rho_ur0=0.6)
    y = rng.normal(size=model.n)
    o = {key: float(v) for key, v in model.observables(y, -1.1, p, tab).items()}
    assert o["alpha"] == pytest.approx((o["h_prime"] + 6 * o["eta_prime"]) / (2 * 0.09), rel=1e-12)
    assert o["psi"] == pytest.approx(o["conformal_hubble"] * o["alpha"] + o["alpha_prime"],
                                     rel=1e-12)
    pi = y[model.index("F_g_2")] + y[model.index("G_g_0")] + y[model.index("G_g_2")]
    assert o["Pi_g"] == pytest.approx(pi, rel=1e-13)


# ------------------------------------------------------------------ configuration and output
def test_config_cl_keys():
    cfg = load_config(DATA.parent.parent / "configs" / "planck_cl.yaml")
    assert cfg.output.cl == ("TT", "EE", "TE", "BB", "PP") and cfg.output.l_max == 2500
    assert cfg.output.lensing is True
    assert load_config({"cosmology": COSMO}).output.cl == ()
    bad = [({"cl": ["TT", "XX"]}, "unknown spectrum 'XX'"),
           ({"cl": ["TT"], "lensing": True}, "add PP"),
           ({"cl": ["TT", "BB"]}, "lensing"),
           ({"cl": ["TT"], "l_max": 10}, "out of range"),
           ({"cl": ["TT"], "lensing": "yes"}, "true or false")]
    for block, message in bad:
        with pytest.raises(ConfigError, match=message):
            load_config({"cosmology": COSMO, "output": block})


def test_stage_rejects_bad_requests():
    from boltzmann.cmb import compute_cl

    for kwargs, message in (({"l_max": 10}, "supported range"), ({"spectra": ("TT", "XY")}, "unknown"),
                            ({"lensing": True, "spectra": ("TT",)}, "add PP")):
        with pytest.raises(ValueError, match=message):
            compute_cl(None, None, None, None, **kwargs)


def test_cl_csv(tmp_path):
    ell = np.arange(2, 101)
    cl = {"TT": 1.0 / (ell * (ell + 1.0)), "EE": 0.5 / (ell * (ell + 1.0)),
          "TE": -0.1 / (ell * (ell + 1.0)), "PP": 1e-7 / (ell * (ell + 1.0)) ** 2}
    spectra = ClSpectra(ell=ell, cl=cl)
    path = output.write_cl_csv(tmp_path / "cl.csv", spectra, comments=["test"])
    lines = path.read_text().splitlines()
    assert lines[-len(ell) - 1] == "# " + ",".join(output.CL_COLUMNS)
    assert any("muK^2" in line for line in lines[:-len(ell)])
    data = np.loadtxt(path, delimiter=",")
    np.testing.assert_array_equal(data[:, 0], ell)
    np.testing.assert_allclose(data[:, 1], 1 / (2 * np.pi), rtol=1e-9)
    np.testing.assert_allclose(data[:, 3], -0.1 / (2 * np.pi), rtol=1e-9)
    assert np.all(np.isnan(data[:, 4]))
    np.testing.assert_allclose(data[:, 5], 1e-7 / (2 * np.pi), rtol=1e-9)


# ------------------------------------------------------------------ against CLASS
#: (spectrum, ℓ range, tolerance on |ours/CLASS - 1|; TE of √(TT·EE)): the accuracy targets,
#: measured values in docs/cmb.md. The lensed spectra are compared with CLASS lensing from
#: unlensed input to ℓ = 4500 (``accuracy.LENSED_REFERENCES``): the main references lens from
#: input to 3500 and are not converged in BB above ℓ = 1500.
TARGETS = (
    ("TT", (2, 29), 3e-3), ("TT", (30, 2500), 1e-3),
    ("EE", (2, 29), 3e-3), ("EE", (30, 2500), 1e-3),
    ("TE", (2, 2500), 1e-3),
    ("PP", (10, 2000), 5e-3),
    ("TT_lensed", (2, 2500), 2e-3),
    ("EE_lensed", (2, 2500), 2e-3),
    ("TE_lensed", (2, 2500), 2e-3),
    ("BB_lensed", (2, 2500), 1e-2),
)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["lcdm", "heavy_nu", "desi_w0wa"])
def test_spectra_against_class(case):
    """configs/planck_cl.yaml (massless ν), configs/wcdm_heavy_nu.yaml (two 0.1 eV ν, a
    w0-wa fluid) and configs/desi_w0wa.yaml (0.06 eV ν, the DESI w0-wa fluid with PPF), lensed
    to ℓ = 2500, against the CLASS references of tests/data/generate_cl.py."""
    from boltzmann.cmb import cl_for_config
    from boltzmann.cmb.accuracy import REFERENCES, deviations, load_reference

    cfg = load_config(DATA.parent.parent / REFERENCES[case][0])
    res = cl_for_config(cfg, l_max=2500, spectra=("TT", "EE", "TE", "BB", "PP"), lensing=True,
                        backend="jax")
    assert res.info["solver_failures"] == 0
    ref = load_reference(case)
    failures = []
    for name, span, tol in TARGETS:
        worst = deviations(res, ref, ranges=(span,))[(name, span)]
        if worst > tol:
            failures.append(f"{name} {span[0]}-{span[1]}: {worst:.2e} > {tol:g}")
    assert not failures, failures


def test_cli_writes_cl_csv_when_computed(tmp_path):
    from types import SimpleNamespace

    from boltzmann import cli

    assert cli._write_cl(SimpleNamespace(cl=None), tmp_path, []) == []
    ell = np.arange(2, 40)
    spectra = ClSpectra(ell=ell, cl={"TT": np.ones(ell.size)})
    written = cli._write_cl(SimpleNamespace(cl=spectra), tmp_path, ["c"])
    assert written == [tmp_path / output.CL_FILE] and written[0].is_file()


def test_source_chunks_one_cuda_launch_with_rows_jax_chunks_per_group():
    """The sources' solves with tangents: one CUDA launch of every mode, highest k first
    (several waves of direction blocks: the longest start first), each mode with its group's
    row of error weights; on the JAX backend ascending chunks of one group each. Every mode in
    exactly one chunk."""
    from boltzmann import modes
    from boltzmann.cmb.sources import CHUNK, SourcePlan
    from solver import CudaBackend

    K = CHUNK + 5
    k = np.geomspace(1e-4, 0.5, K)
    low = k < 0.01
    plan = SourcePlan(k=k, n_cmb=K, x0=np.zeros(K), x=np.zeros(2), tau_fid=np.ones(2),
                      tau0_fid=1.0, x_rec=0.0, tau_rec_fid=1.0, low=low,
                      streaming=np.zeros((K, 2), bool))
    (idx, pad, controlled), = plan.chunks(CudaBackend(launch="emulated"))
    assert controlled is None and np.all(np.diff(k[idx]) < 0)
    np.testing.assert_array_equal(np.sort(idx), np.arange(K))
    np.testing.assert_array_equal(pad, idx)
    model = modes.model_for(load_config("lcdm").cosmology, load_config("lcdm").precision)
    rows = plan.error_weight_rows(model)[pad]
    photons = model.index("F_g_0")
    assert np.all((rows[:, photons] > 0) == low[idx])
    chunks = plan.chunks("jax")
    np.testing.assert_array_equal(np.sort(np.concatenate([c[0] for c in chunks])), np.arange(K))
    for idx, pad, controlled in chunks:
        assert controlled in (True, False) and np.all(low[idx] == controlled)
        np.testing.assert_array_equal(pad[:idx.size], idx)
        assert pad.size == CHUNK and np.all(np.diff(k[idx]) > 0)


def test_source_chunks_run_two_at_a_time_after_the_first(monkeypatch):
    """On a CPU of two cores the JAX backend's source chunks run two at a time, the first alone
    (it compiles the program), the results in the launches' order."""
    import threading
    import time
    from types import SimpleNamespace

    from boltzmann import gradients_ahead
    from boltzmann.cmb.sources import _solve_side_by_side

    monkeypatch.setattr(gradients_ahead, "parallel_solves", lambda: 2)
    events, lock = [], threading.Lock()

    def run(launch):
        with lock:
            events.append(("start", launch))
        time.sleep(0.05)
        with lock:
            events.append(("end", launch))
        return SimpleNamespace(ys=np.full(3, float(launch)))

    out = _solve_side_by_side(run, list(range(5)))
    assert [float(s.ys[0]) for s in out] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert events[:2] == [("start", 0), ("end", 0)]          # the first alone
    running, most = 0, 0
    for kind, _ in events:
        running += 1 if kind == "start" else -1
        most = max(most, running)
    assert most == 2                                          # then two side by side
    monkeypatch.setattr(gradients_ahead, "parallel_solves", lambda: 1)
    events.clear()
    _solve_side_by_side(run, list(range(3)))
    assert [e for e, _ in events] == ["start", "end"] * 3    # one core: in turn
