"""The CMB on the GPU: sources and C_ℓ from the CUDA backend's solve against the JAX backend's
(``-m gpu``; skipped without a CUDA GPU). Both integrate the same equations with the same
Rodas5P tableau and controller, so they differ by rounding only."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from boltzmann import modes
from boltzmann.cmb import cl_for_config
from boltzmann.cmb.sampling import ClSampling
from boltzmann.cmb.sources import compute_sources
from boltzmann.ensemble import stack_cosmologies
from boltzmann.params import load_config
from boltzmann.tables import compute_tables

REPO = Path(__file__).resolve().parents[1]
L_MAX = 500
#: below this k [1/Mpc] the sources' accuracy is bounded by the absolute tolerance (see below)
K_ATOL_LIMITED = 1e-4


@pytest.fixture(scope="module")
def planck():
    return load_config(REPO / "configs" / "planck_cl.yaml")


@pytest.mark.gpu
def test_cmb_sources_cuda_equal_jax(planck):
    """S_0, S_1, S_2, S_E, S_φ on the (k, τ) grid: within 1e-5 of each source's largest |S|,
    and within 1e-5 of each mode's largest |S| for the modes whose photons are in error control.

    Above ``k_photon_control`` the photon moments are outside error control (as for P(k)), so
    their values between recombination and z = 200 carry the truncation error of whatever steps
    were taken, and the two backends' steps differ by rounding: on the CPU, a change of h by
    1e-13 moves those modes' S_2 by 2e-3 and S_0 by 4e-4 of the mode's own largest value, but
    every source by ≤ 3e-7 of its largest value over all modes (the modes beyond the CMB grid
    feed only S_φ and are compared there). Holding every mode to 1e-5 of its own largest |S|
    fails for that reason: 7e-3 (S_0) on an H200.

    The modes far outside the horizon at recombination (k < ``K_ATOL_LIMITED``) are compared
    separately: their densities and h are O((kτ)²) ~ 1e-6 of η there, so the absolute tolerance
    (1e-10) bounds their relative accuracy, and S_0 = g(δ_γ/4 + α') recovers an O(1) α' from
    them by cancellation. Against a solve at rtol 1e-9, atol 1e-18 their S_0 is off by 2.5e-3
    (k = 7e-6/Mpc) and 3e-4 (2.4e-5/Mpc) of its largest value on either backend, 8e-7 at
    1e-4/Mpc (scripts/cmb_atol_low_k.py; docs/cmb.md, Accuracy); the H200 and the CPU differ there by 2.6e-3 (2026-12-02),
    so those modes' S_0 is held to 5e-3. They project to kτ0 < 1.5, below ℓ = 2's peak, and
    the C_ℓ test below bounds what reaches the spectra."""
    stacked = stack_cosmologies([planck.cosmology])
    model = modes.model_for(planck.cosmology, planck.precision)
    tables = compute_tables(stacked, modes.make_grid(planck.precision), model)
    src = {b: compute_sources(tables, stacked, planck.precision, model, L_MAX,
                              lensing_modes=True, backend=b) for b in ("jax", "cuda")}
    assert np.all(src["cuda"].status == 0) and np.all(src["jax"].status == 0)
    np.testing.assert_array_equal(src["cuda"].k, src["jax"].k)
    n_cmb = src["jax"].n_cmb
    k = src["jax"].k
    well = k >= K_ATOL_LIMITED
    controlled = well[:n_cmb] & (k[:n_cmb] < ClSampling().k_photon_control)
    assert controlled.sum() >= 10 and (~well).sum() >= 5
    for name in ("t0", "t1", "t2", "e", "phi"):
        a, b = np.asarray(getattr(src["jax"], name)), np.asarray(getattr(src["cuda"], name))
        w, ctrl = well, np.concatenate([controlled, np.zeros(k.size - n_cmb, bool)])
        if name != "phi":  # S_φ alone has the lensing modes beyond the CMB grid
            a, b, w, ctrl = a[:n_cmb], b[:n_cmb], well[:n_cmb], controlled
        top = np.max(np.abs(a))
        overall = np.max(np.abs(b[w] - a[w])) / top
        assert overall < 1e-5, (name, overall)
        limited = np.max(np.abs(b[~w] - a[~w])) / top
        assert limited < (5e-3 if name == "t0" else 1e-5), (name, "k < K_ATOL_LIMITED", limited)
        scale = np.max(np.abs(a[ctrl]), axis=1, keepdims=True)
        per_mode = np.max(np.abs(b[ctrl] - a[ctrl]) / np.where(scale > 0, scale, 1))
        assert per_mode < 1e-5, (name, per_mode)


@pytest.mark.gpu
def test_cl_cuda_equal_jax(planck):
    """Unlensed TT, EE, PP within 1e-5, TE within 1e-5 of √(TT·EE), ℓ = 2..500."""
    cl = {b: cl_for_config(planck, l_max=L_MAX, spectra=("TT", "EE", "TE", "PP"),
                           lensing=False, backend=b) for b in ("jax", "cuda")}
    j, c = cl["jax"].cl, cl["cuda"].cl
    for name in ("TT", "EE", "PP"):
        rel = np.max(np.abs(c[name] / j[name] - 1.0))
        assert rel < 1e-5, (name, rel)
    te = np.max(np.abs(c["TE"] - j["TE"]) / np.sqrt(j["TT"] * j["EE"]))
    assert te < 1e-5, te


@pytest.mark.gpu
def test_cl_jacobian_cuda_equals_jax(planck):
    """∂D_ℓ/∂θ from the CUDA sensitivity kernel against the JAX backend's joint solve: unlensed
    TT, EE, TE, PP to ℓ = 60 (the reduced hierarchies and coarsened sampling of
    tests/test_cmb_gradients.py), three parameters entering through different stages, within
    1e-4 of each parameter's largest |∂ln D_ℓ/∂θ| (TE relative to √(TT·EE)). The two backends
    take different steps (per-direction against joint error control), so they agree to the
    solver's tolerance, not to rounding; the values to 1e-5 as in ``test_cl_cuda_equal_jax``."""
    import dataclasses

    from boltzmann.cmb.gradients import LOG_SPECTRA, ClFunction

    config = dataclasses.replace(
        planck, output=dataclasses.replace(planck.output, cl=("TT", "EE", "TE", "PP"),
                                           l_max=60, lensing=False),
        precision=load_config(REPO / "configs" / "lcdm_reduced.yaml").precision)
    sampling = ClSampling().coarser(2.0)
    params = ("h", "omega_cdm", "tau_reio")
    fns = {b: ClFunction(config, parameters=params, sampling=sampling, backend=b)
           for b in ("jax", "cuda")}
    # on an accelerator every solved direction passes the line of sight at once
    assert all(f.direction_block == 3 for f in fns.values())
    out = {b: f.jacobian() for b, f in fns.items()}
    (vj, jj), (vc, jc) = out["jax"], out["cuda"]
    exact, other = [], []
    for name in ("TT", "EE", "TE", "PP"):
        ref = np.asarray(vj[name])
        scale = np.abs(ref) if name in LOG_SPECTRA else \
            np.sqrt(np.asarray(vj["TT"]) * np.asarray(vj["EE"]))
        assert np.max(np.abs(np.asarray(vc[name]) - ref) / scale) < 1e-5, name
        exact.append(np.asarray(jj[name]) / scale[:, None])
        other.append(np.asarray(jc[name]) / scale[:, None])
    exact, other = np.concatenate(exact), np.concatenate(other)
    worst = {p: float(np.max(np.abs(other[:, i] - exact[:, i])) / np.max(np.abs(exact[:, i])))
             for i, p in enumerate(params)}
    assert max(worst.values()) < 1e-4, worst
