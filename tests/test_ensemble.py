"""boltzmann.ensemble: several cosmologies in one solver launch give the single-cosmology
pipeline's P(k) (same model, tables, rows, initial states and tolerances per trajectory, so the
differences are rounding), an ensemble of one is the single run bit for bit, and mixed species
structures are refused. The CUDA kernel's text (run by the CPU emulator) gives the same spectra
from the same stacked tables.
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
    assert ens.failures() == [] and ens.solver_stats()["trajectories"] == 2 * 8
    assert ens.k.shape == (2, 8)
    assert ens.spectra.pk_m.shape == (2, 2, 8) and ens.spectra.sigma8.shape == (2, 2)
    for i, (c, res) in enumerate(zip(cosmos, singles)):
        assert res.failures() == []
        np.testing.assert_array_equal(ens.k[i], res.k[0])
        for iz, z in enumerate(cfg.output.z):
            for name, pks in (("d_m", ens.spectra.pk_m), ("d_cb", ens.spectra.pk_cb)):
                ref = np.asarray(spectra.power_from_transfer(
                    res.k[0], res.transfers.fields[name][0, iz], c.A_s, c.n_s, c.k_pivot))
                rel = np.abs(pks[i, iz] / ref - 1.0)
                # rounding only; a rounding-flipped accept/reject decision of one trajectory
                # would show as ~rtol at that k, never in the bulk
                assert np.median(rel) <= 1e-6, f"cosmology {i} {name} z={z}: {rel}"
                assert rel.max() <= 10 * cfg.precision.rtol, f"cosmology {i} {name} z={z}: {rel}"
            # σ8 integrates over the modes the k range misses (to 5 h/Mpc), in both runs
            s8 = float(res.spectra.sigma8[0, iz])
            assert abs(ens.spectra.sigma8[i, iz] / s8 - 1.0) <= 1e-5
            assert res.spectra.sigma8_k[0, -1] >= 5.0 * float(c.h)
    # the cosmologies really differ
    assert abs(ens.spectra.sigma8[1, 0] / ens.spectra.sigma8[0, 0] - 1.0) > 1e-3
    assert set(ens.timings) >= {"tables", "perturbations", "spectra", "total"}


def test_ensemble_of_one_is_the_single_run_bit_for_bit(runs):
    """``pipeline.run`` and ``run_ensemble`` on one cosmology share every stage function: the
    tables, transfer functions, P(k) and σ8 agree exactly, not to rounding."""
    cfg, cosmos, _, singles = runs
    one = ensemble.run_ensemble([cosmos[1]], cfg.precision, cfg.output, backend="jax")
    single = singles[1]
    np.testing.assert_array_equal(one.tables.model_table, single.tables.model_table)
    assert one.transfers.fields.keys() == single.transfers.fields.keys()
    for name, v in single.transfers.fields.items():
        np.testing.assert_array_equal(one.transfers.fields[name], v, err_msg=name)
    for name in ("pk_m", "pk_cb", "sigma8", "sigma8_cb"):
        np.testing.assert_array_equal(getattr(one.spectra, name), getattr(single.spectra, name))
    np.testing.assert_array_equal(one.transfers.n_accepted, single.transfers.n_accepted)


def test_cuda_kernel_logic_with_stacked_tables(runs):
    """The CUDA kernel's text, run by the CPU emulator, on the same launch (two cosmologies'
    tables, rows pointing at them; the modes in the one launch's order, highest k first): P(k)
    equal to the JAX backend's to rounding."""
    from solver import CudaBackend

    cfg, cosmos, ens, _ = runs
    emu = ensemble.run_ensemble(cosmos, cfg.precision, cfg.output,
                                backend=CudaBackend(launch="emulated"),
                                check_sigma8_coverage=False)
    assert emu.backend == "cuda-emulated" and emu.failures() == []
    for iz, z in enumerate(cfg.output.z):
        rel = np.abs(emu.spectra.pk_m[:, iz] / ens.spectra.pk_m[:, iz] - 1.0)
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


@pytest.mark.slow  # two compilations of the batched tables (~45 s on 2 cores)
def test_tables_in_pieces_equal_one_piece():
    """Large batches compute their tables in pieces of TABLE_CHUNK (one compiled program, the last
    piece padded): the result is the one-piece result, in order (to rounding: XLA vectorises a
    batch of 3 differently from one of 7)."""
    from boltzmann import modes, tables

    cfg = _small_config()
    cosmos = ensemble.fiducial_ensemble(7, cfg)
    stacked = ensemble.stack_cosmologies(cosmos)
    model = modes.model_for(cosmos[0], cfg.precision)
    grid = modes.make_grid(cfg.precision)
    whole = tables.compute_tables(stacked, grid, model, chunk=16)
    pieces = tables.compute_tables(stacked, grid, model, chunk=3)
    assert whole.model_table.shape[0] == 7
    np.testing.assert_allclose(np.asarray(pieces.model_table), np.asarray(whole.model_table),
                               rtol=1e-12, atol=1e-300)
    for name in tables.DERIVED:
        np.testing.assert_allclose(pieces.derived[name], whole.derived[name], rtol=1e-12)


def test_padded_chunks_repeat_a_chunks_last_mode():
    from boltzmann.perturbations import padded_chunks

    idx = padded_chunks([np.array([3, 0, 2]), np.array([1])])
    assert idx.tolist() == [[3, 0, 2], [1, 1, 1]]
    with pytest.raises(ValueError, match="at least one mode"):
        padded_chunks([np.array([0]), np.array([], np.int64)])


def test_chunk_groups_deal_every_chunk_once_and_balance_by_k():
    """The Jacobian's concurrent solves: equal-shaped groups that together hold every chunk
    once; the chunk of the largest k (most steps) shares its group with the smallest."""
    from boltzmann.perturbations import chunk_groups, padded_chunks

    chunks = [np.arange(c * 26, min(101, (c + 1) * 26)) for c in range(4)]
    groups = chunk_groups(chunks, 2)
    assert len(groups) == 2 and groups[0].shape == groups[1].shape == (2, 26)
    rows = sorted(tuple(r) for g in groups for r in g.tolist())
    assert rows == sorted(tuple(r) for r in padded_chunks(chunks).tolist())
    assert {int(g[0, 0]) for g in groups if 78 in g[:, 0]} == {0}
    assert len(chunk_groups(chunks[:3], 2)) == 1          # three chunks do not split in two
    assert len(chunk_groups(chunks, 1)) == 1


def test_solve_order_longest_first_in_one_launch():
    """Ascending k (ties by cosmology) for chunked solves; one GPU launch takes the reverse, the
    high-k modes (the most steps) first."""
    from boltzmann import modes

    k = np.array([[0.1, 1.0, 0.01], [0.1, 2.0, 0.01]])
    np.testing.assert_array_equal(modes.solve_order(k, False), [2, 5, 0, 3, 1, 4])
    np.testing.assert_array_equal(modes.solve_order(k, True), [4, 1, 3, 0, 5, 2])
