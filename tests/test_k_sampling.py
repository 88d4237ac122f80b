"""The sparse solve grid above ``precision.k_solve_dense_below`` (boltzmann/k_sampling.py): which
modes are solved, the spline that fills in P(k) at the others, and the driver solving fewer
modes for P within a stated tolerance of every mode solved."""
import copy
import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boltzmann import k_sampling
from boltzmann.ensemble import run_config_ensemble
from boltzmann.params import ConfigError, load_config
from boltzmann.perturbations import Transfers
from boltzmann.spectra import Spectra, on_requested_k, power_spectra

#: configs/lcdm.yaml's grid in h/Mpc: 1e-4..10 at 20 a decade (101 modes, 1 h/Mpc is mode 80)
K_H = np.logspace(-4, 1, 101)


def precision(stride, dense_below=1.0):
    return SimpleNamespace(k_solve_stride=stride, k_solve_dense_below=dense_below)


def test_solved_indices_cut_stride_and_last():
    solved = k_sampling.solved_indices(K_H, 4, 1.0)
    np.testing.assert_array_equal(solved, np.r_[np.arange(80), 80, 84, 88, 92, 96, 100])
    # a stride that misses the last mode still solves it: nothing is extrapolated
    solved = k_sampling.solved_indices(K_H, 3, 1.0)
    np.testing.assert_array_equal(solved[80:], [80, 83, 86, 89, 92, 95, 98, 100])
    np.testing.assert_array_equal(k_sampling.solved_indices(K_H, 1, 1.0), np.arange(101))
    # the cut in h/Mpc: 0.1 h/Mpc is mode 60
    assert k_sampling.solved_indices(K_H, 2, 0.1)[:62].tolist() == list(range(60)) + [60, 62]
    # any order of the grid: the same modes, by k
    perm = np.random.default_rng(0).permutation(K_H.size)
    np.testing.assert_array_equal(np.sort(perm[k_sampling.solved_indices(K_H[perm], 4, 1.0)]),
                                  k_sampling.solved_indices(K_H, 4, 1.0))
    # a grid in 1/Mpc shared by cosmologies of different h: cut at the largest h, so every
    # cosmology has every mode below its own cut solved
    h = np.array([0.6, 0.8])
    k = np.broadcast_to(K_H * 0.7, (2, K_H.size))
    grid = k_sampling.cut_grid_h(k, None, h)
    sampling = k_sampling.choose(k, None, h, precision(4))
    for hh in h:
        own_dense = np.flatnonzero(k[0] / hh < 1.0)
        assert np.isin(own_dense, sampling.solved).all()
    assert sampling.solved.size == k_sampling.solved_indices(grid, 4, 1.0).size


def test_spline_reproduces_cubics_and_copies_the_solved_modes():
    sampling = k_sampling.choose(K_H[None] * 0.67, K_H, [0.67], precision(4))
    assert sampling.solved.size == 86 and not sampling.every_mode
    x = np.log(K_H)
    cubic = 0.3 - 1.2 * x + 0.4 * x**2 - 0.07 * x**3   # not-a-knot: exact for a cubic
    np.testing.assert_allclose(sampling.fill(cubic[sampling.solved]), cubic, rtol=0,
                               atol=1e-12)
    w = sampling.matrix()
    np.testing.assert_array_equal(w[sampling.solved], np.eye(sampling.solved.size))
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-13)
    # solved P bit for bit, the others within the spline's error of a smooth spectrum
    pk = np.exp(cubic + 0.01 * np.sin(x))
    filled = sampling.fill_power(pk[sampling.solved])
    np.testing.assert_array_equal(filled[sampling.solved], pk[sampling.solved])
    assert 1e-8 < np.abs(filled / pk - 1).max() < 3e-5
    # the transfer function's spline is P's: ln P − 2 ln|T| is a quadratic in ln k
    d = -np.sqrt(pk * K_H**3 * (K_H / 0.05) ** 0.04)
    got = sampling.fill_transfer(d[sampling.solved])
    want = -np.sqrt(filled * K_H**3 * (K_H / 0.05) ** 0.04)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_failed_solved_mode_spreads_and_stride_one_changes_nothing():
    sampling = k_sampling.choose(K_H[None], K_H, [1.0], precision(4))
    pk = np.exp(-np.log(K_H) ** 2 / 10)[sampling.solved]
    pk[84] = np.nan                                   # a failed mode among the solved
    ok = np.isfinite(pk)
    for filled in (sampling.fill_power(pk), np.asarray(sampling.fill_power(jnp.asarray(pk)))):
        assert np.isnan(filled[sampling.interpolated]).all()     # numpy and under JAX
        np.testing.assert_array_equal(filled[sampling.solved][ok], pk[ok])
    one = k_sampling.choose(K_H[None], K_H, [1.0], precision(1, 0.01))
    assert one.every_mode and one.fill_power(pk) is pk and one.fill_transfer(pk) is pk


def test_derivatives_follow_the_same_spline():
    """Under JAX the fill is linear in ln P: d ln P = W d ln P_solved (jvp through
    power_spectra, as PowerSpectrumFunction differentiates it), and stride 1's program is the
    plain one."""
    sampling = k_sampling.choose(K_H[None] * 0.7, K_H, [0.7], precision(4))
    s = sampling.solved
    kk = K_H * 0.7
    d_m = -(1.0 + (kk / 0.02) ** 2) ** -1.0
    fields = {"d_m": jnp.asarray(d_m[s])[None, None], "d_cb": jnp.asarray(d_m[s])[None, None]}
    cosmos = SimpleNamespace(A_s=jnp.array([2.1e-9]), n_s=jnp.array([0.965]),
                             k_pivot=jnp.array([0.05]), h=jnp.array([0.7]))

    def ln_pm(scale):
        f = {n: v * (1.0 + scale * jnp.log(jnp.asarray(kk[s]))) for n, v in fields.items()}
        return jnp.log(power_spectra(f, kk[None], cosmos, with_sigma8=False,
                                     sampling=sampling)["P_m"][0, 0])

    value, tangent = jax.jvp(ln_pm, (0.0,), (1.0,))
    np.testing.assert_allclose(np.asarray(tangent), 2 * sampling.fill(np.log(kk[s])),
                               rtol=1e-12, atol=1e-12)
    full = {n: jnp.asarray(d_m)[None, None] for n in fields}
    plain = power_spectra(full, kk[None], cosmos, with_sigma8=False)["P_m"]
    np.testing.assert_array_equal(np.asarray(value)[s], np.log(np.asarray(plain))[0, 0, s])
    every = k_sampling.every_mode(kk.size)
    np.testing.assert_array_equal(
        np.asarray(power_spectra(full, kk[None], cosmos, with_sigma8=False,
                                 sampling=every)["P_m"]), np.asarray(plain))


def test_failed_sigma8_mode_named_and_transfers_on_their_own_k():
    """on_requested_k keeps the solved requested modes in the transfers and names a failed
    solved mode σ8 added (it leaves no transfer behind)."""
    k = K_H[None] * 0.7
    sampling = k_sampling.choose(k, K_H, [0.7], precision(4))
    s = sampling.solved
    status = np.zeros((1, s.size), int)
    status[0, -1] = 3                                  # the last mode, one σ8 added
    fields = {"d_m": np.ones((1, 1, s.size))}
    transfers = Transfers(k=k[:, s], z=(0.0,), k_h=K_H[s], fields=fields, status=status,
                          n_accepted=np.ones_like(status), n_rejected=np.zeros_like(status),
                          backend="jax")
    spectra = Spectra(k=k, z=(0.0,), pk_m=np.ones((1, 1, K_H.size)),
                      pk_cb=np.ones((1, 1, K_H.size)), sigma8=np.ones((1, 1)),
                      sigma8_cb=np.ones((1, 1)))
    keep = np.arange(100)                              # σ8 added the last mode
    cut_t, cut_s = on_requested_k(transfers, spectra, keep, sampling)
    assert cut_s.k.shape == (1, 100) and cut_s.sigma8_k.shape == (1, 101)
    np.testing.assert_array_equal(cut_t.k[0], k[0, s[:-1]])
    assert cut_t.failures() == []
    assert len(cut_s.problems) == 2 and f"{k[0, -1]:.4g}" in cut_s.problems[0][3]


@pytest.mark.parametrize("key, value", [("k_solve_stride", 0), ("k_solve_stride", 17),
                                        ("k_solve_dense_below", -1.0)])
def test_bad_settings_name_the_key(key, value):
    cfg = {"cosmology": {"h": 0.6736, "omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9,
                         "n_s": 0.9649, "tau_reio": 0.0544},
           "precision": {key: value}}
    with pytest.raises(ConfigError, match=f"precision.{key} = .* out of range"):
        load_config(copy.deepcopy(cfg))


def test_driver_solves_the_sampled_modes_and_fills_in_p(monkeypatch):
    """``run_ensemble``'s wiring without a solve (the physics is the ``slow`` test below): the
    perturbation stage is given only the sampled modes (with their k in h/Mpc), the transfers
    stay on them, P(k) and σ8 come back on the whole requested axis, the spline's P within
    1e-5 of the analytic spectrum the fake transfers give at the modes not solved."""
    from boltzmann import ensemble

    cfg = load_config("lcdm_reduced")
    output = dataclasses.replace(cfg.output, k_min=1e-3, k_max=5.0, k_per_decade=10.5)
    seen = []

    def transfer(k):    # smooth in ln k, like a matter transfer function at high k
        return 1.0 / (1.0 + (k / 0.02) ** 2) ** 0.9

    def fake_perturbations(tables, cosmos, k, zs, precision, model, *, k_h=None, **kw):
        seen.append((np.asarray(k).copy(), None if k_h is None else np.asarray(k_h).copy()))
        C, K, Z = k.shape[0], k.shape[1], len(zs)
        d = np.broadcast_to(transfer(np.asarray(k))[:, None, :], (C, Z, K)).copy()
        return Transfers(k=np.asarray(k), z=tuple(zs), k_h=k_h, fields={"d_m": d, "d_cb": d},
                         status=np.zeros((C, K), np.int32), n_accepted=np.ones((C, K)),
                         n_rejected=np.zeros((C, K)), backend="fake")

    monkeypatch.setattr(ensemble, "compute_tables", lambda *a, **k: None)
    monkeypatch.setattr(ensemble, "compute_perturbations", fake_perturbations)
    out = {}
    for stride in (1, 2):
        prec = dataclasses.replace(cfg.precision, k_solve_stride=stride, k_solve_dense_below=1.0)
        out[stride] = ensemble.run_ensemble([cfg.cosmology], prec, output, backend="jax")
    (k_every, kh_every), (k_fewer, kh_fewer) = seen
    assert k_every.shape == (1, 40) and k_fewer.shape == (1, 37)
    np.testing.assert_array_equal(kh_fewer, kh_every[np.isin(kh_every, kh_fewer)])
    assert kh_fewer[-1] == kh_every[-1] and np.all(np.isin(kh_every[kh_every < 1.0], kh_fewer))
    every, fewer = out[1], out[2]
    assert fewer.transfers.k.shape == (1, 37) and fewer.k.shape == every.k.shape == (1, 40)
    np.testing.assert_array_equal(fewer.k, every.k)
    solved = np.isin(every.k[0], fewer.transfers.k[0])
    np.testing.assert_array_equal(fewer.spectra.pk_m[..., solved], every.spectra.pk_m[..., solved])
    err = np.abs(fewer.spectra.pk_m / every.spectra.pk_m - 1)[..., ~solved]
    assert 1e-12 < err.max() < 1e-5
    np.testing.assert_allclose(fewer.spectra.sigma8, every.spectra.sigma8, rtol=1e-7)


@pytest.mark.slow
def test_sparse_grid_end_to_end():
    """configs/lcdm_reduced.yaml on 1e-3..5 h/Mpc at 10.5 a decade (40 modes, σ8 adds none):
    stride 2 above 1 h/Mpc solves 37 (the same lock-step chunk size, one compile) and gives P
    within 1e-4 of every mode solved (measured 2.4e-5), the solved modes' P equal to solve
    noise, σ8 to 1e-6; the transfers hold the solved modes; the Jacobian's function solves the
    same modes."""
    from boltzmann.gradients import PowerSpectrumFunction

    cfg = load_config("lcdm_reduced")
    output = dataclasses.replace(cfg.output, k_min=1e-3, k_max=5.0, k_per_decade=10.5)
    cfg = dataclasses.replace(cfg, output=output)
    sparse = dataclasses.replace(cfg, precision=dataclasses.replace(
        cfg.precision, k_solve_stride=2, k_solve_dense_below=1.0))
    every = run_config_ensemble(cfg, [cfg.cosmology], backend="jax")
    fewer = run_config_ensemble(sparse, [cfg.cosmology], backend="jax")
    assert every.k.shape == fewer.k.shape == (1, 40)
    assert fewer.transfers.k.shape == (1, 37) and every.transfers.k.shape == (1, 40)
    solved = np.isin(every.k[0], fewer.transfers.k[0])
    assert solved[:33].all() and solved[-1] and solved.sum() == 37
    err = np.abs(fewer.spectra.pk_m / every.spectra.pk_m - 1)
    assert err[..., solved].max() < 1e-8
    assert 1e-7 < err[..., ~solved].max() < 1e-4
    assert np.abs(fewer.spectra.pk_cb / every.spectra.pk_cb - 1).max() < 1e-4
    np.testing.assert_allclose(fewer.spectra.sigma8, every.spectra.sigma8, rtol=1e-6)
    steps = [int(r.transfers.stats()["steps_total"]) for r in (every, fewer)]
    assert steps[1] < steps[0]
    fn = PowerSpectrumFunction(sparse, parameters=["omega_cdm"], backend="jax")
    np.testing.assert_allclose(fn.k_solve, fewer.transfers.k[0], rtol=1e-13)
    assert fn.k_axis.size == 40
