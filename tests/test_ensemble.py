"""boltzmann.ensemble: several cosmologies in one solver launch give the single-cosmology
pipeline's P(k) (same model, tables, rows, initial states and tolerances per trajectory, so the
differences are rounding), and mixed species structures are refused. The CUDA kernel's text
(run by the CPU emulator) gives the same spectra from the same stacked tables.
"""
import dataclasses

import numpy as np
import pytest

from boltzmann import ensemble, pipeline, spectra
from boltzmann.params import CosmoParams, load_config


def _small_config():
    cfg = load_config("lcdm")
    prec = dataclasses.replace(cfg.precision, l_max_g=8, l_max_pol_g=6, l_max_ur=8,
                               l_max_ncdm=6, n_q_ncdm=2, bg_n_lna=1000)
    # 8 wavenumbers, 1e-3 ... 1 h/Mpc
    out = dataclasses.replace(cfg.output, k_min=1e-3, k_max=1.0, k_per_decade=7 / 3, z=(0.0, 1.0))
    return dataclasses.replace(cfg, precision=prec, output=out)


@pytest.fixture(scope="module")
def runs():
    cfg = _small_config()
    cosmos = ensemble.fiducial_ensemble(2, cfg, seed=3)
    ens = ensemble.run_ensemble(cosmos, cfg.precision, cfg.output, backend="jax")
    singles = [pipeline.run(dataclasses.replace(cfg, cosmology=c), backend="jax")
               for c in cosmos]
    return cfg, cosmos, ens, singles


def test_ensemble_matches_single_pipeline(runs):
    cfg, cosmos, ens, singles = runs
    assert ens.failed == [] and ens.solver_stats["trajectories"] == 2 * 8
    assert ens.k.shape == (2, 8)
    for i, (c, res) in enumerate(zip(cosmos, singles)):
        assert res.solver_stats["failed_k"] == []
        np.testing.assert_array_equal(ens.k[i], res.k)
        for z in cfg.output.z:
            for name, pks in (("d_m", ens.pk_m), ("d_cb", ens.pk_cb)):
                ref = np.asarray(spectra.power_from_transfer(
                    res.k, res.transfers[z][name], c.A_s, c.n_s, c.k_pivot))
                rel = np.abs(pks[z][i] / ref - 1.0)
                # rounding only; a rounding-flipped accept/reject decision of one trajectory
                # would show as ~rtol at that k, never in the bulk
                assert np.median(rel) <= 1e-6, f"cosmology {i} {name} z={z}: {rel}"
                assert rel.max() <= 10 * cfg.precision.rtol, f"cosmology {i} {name} z={z}: {rel}"
            s8 = float(spectra.sigma8(res.k, np.asarray(spectra.power_from_transfer(
                res.k, res.transfers[z]["d_m"], c.A_s, c.n_s, c.k_pivot)), c.h,
                check_coverage=False))
            assert abs(ens.sigma8[z][i] / s8 - 1.0) <= 1e-5
    # the cosmologies really differ
    assert abs(ens.sigma8[0.0][1] / ens.sigma8[0.0][0] - 1.0) > 1e-3
    assert set(ens.timings) >= {"tables", "initial_conditions", "solve", "spectra", "total"}


def test_cuda_kernel_logic_with_stacked_tables(runs, monkeypatch):
    """The CUDA kernel's text, run by the CPU emulator, on the same launch (two cosmologies'
    tables, rows pointing at them): P(k) equal to the JAX backend's to rounding."""
    from solver import cuda_backend

    cfg, cosmos, ens, _ = runs

    def emulated(rhs, y0, ts, params, *, backend, linear_solver="auto", **kw):
        assert backend == "cuda"
        return cuda_backend.solve_emulated(rhs, y0, ts, params, **kw)

    monkeypatch.setattr(ensemble, "solve", emulated)
    emu = ensemble.run_ensemble(cosmos, cfg.precision, cfg.output, backend="cuda",
                                check_sigma8_coverage=False)
    assert emu.backend == "cuda-emulated" and emu.failed == []
    for z in cfg.output.z:
        rel = np.abs(emu.pk_m[z] / ens.pk_m[z] - 1.0)
        assert np.median(rel) <= 1e-6 and rel.max() <= 10 * cfg.precision.rtol, rel


def test_structure_mismatch_raises():
    cfg = load_config("lcdm")
    massless = load_config("lcdm_massless").cosmology
    with pytest.raises(ensemble.StructureMismatch, match=r"cosmology 1 has 0 ncdm species"):
        ensemble.run_ensemble([cfg.cosmology, massless], cfg.precision, cfg.output)
    two = dataclasses.replace(cfg.cosmology, m_ncdm=np.array([0.03, 0.03]),
                              deg_ncdm=np.ones(2), T_ncdm=np.full(2, 0.71611))
    with pytest.raises(ensemble.StructureMismatch, match="same|share"):
        ensemble.run_ensemble([cfg.cosmology, two], cfg.precision, cfg.output)
    fld = CosmoParams.make(h=0.67, omega_b=0.022, omega_cdm=0.12, n_s=0.96, tau_reio=0.05,
                           A_s=2.1e-9, m_ncdm=[0.06], N_ur=2.0308, w0_fld=-0.9)
    with pytest.raises(ensemble.StructureMismatch, match="fluid"):
        ensemble.run_ensemble([cfg.cosmology, fld], cfg.precision, cfg.output)


def test_fiducial_ensemble_is_deterministic_spread():
    a = ensemble.fiducial_ensemble(16, "lcdm", seed=1)
    b = ensemble.fiducial_ensemble(16, "lcdm", seed=1)
    fid = load_config("lcdm").cosmology
    assert all(float(getattr(a[0], p)) == float(getattr(fid, p))
               for p in ensemble.SPREAD_PARAMETERS)
    for name in ensemble.SPREAD_PARAMETERS:
        va = np.array([float(getattr(c, name)) for c in a])
        vb = np.array([float(getattr(c, name)) for c in b])
        np.testing.assert_array_equal(va, vb)
        rel = va[1:] / float(getattr(fid, name)) - 1.0
        assert np.all(np.abs(rel) <= 0.05) and rel.max() - rel.min() > 0.05
        # Latin hypercube: one point per stratum of the 15 non-fiducial points
        strata = np.floor((rel + 0.05) / 0.1 * 15).astype(int)
        assert sorted(strata) == list(range(15))
    assert all(np.array_equal(c.m_ncdm, fid.m_ncdm) for c in a)


def test_tables_in_chunks_equals_one_piece():
    """Large batches compute their tables in pieces of TABLE_CHUNK (one compiled program, the last
    piece padded): the result is the one-piece result, in order, whatever the chunk size."""
    import jax
    import jax.numpy as jnp

    cosmos = ensemble.fiducial_ensemble(7, "lcdm_massless")
    stacked = ensemble.stack_cosmologies(cosmos)
    calls = []

    @jax.jit
    def tables_fn(st):
        calls.append(st.h.shape)  # traces only: one per distinct piece shape
        tab = jax.vmap(lambda c: jnp.stack([c.h * jnp.arange(3.0), c.omega_b + jnp.arange(3.0)]))(st)
        return tab, {"z_reio": st.n_s * 10.0}

    ref_tab, ref_der = ensemble._tables_in_chunks(tables_fn, stacked, 7, chunk=16)
    for chunk in (1, 3, 4, 7):
        tab, der = ensemble._tables_in_chunks(tables_fn, stacked, 7, chunk=chunk)
        np.testing.assert_array_equal(np.asarray(tab), np.asarray(ref_tab))
        np.testing.assert_array_equal(der["z_reio"], ref_der["z_reio"])
    assert ref_tab.shape == (7, 2, 3)
    np.testing.assert_allclose(ref_der["z_reio"], [10.0 * float(c.n_s) for c in cosmos])
    assert calls == [(7,), (1,), (3,), (4,)]  # one trace per piece size; chunk 7 reuses the first
