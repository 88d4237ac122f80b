"""Stage 4 (after the perturbations): CMB angular power spectra of one cosmology.

``compute_cl(tables, cosmos, precision, model, l_max=..., spectra=..., lensing=...)`` →
:class:`boltzmann.cmb.spectra.ClSpectra`:

1. ``sources.compute_sources`` — the CMB modes (their own k grid and dense conformal times),
   solved by ``solver.solve``, and the sources S_0, S_1, S_2, S_E, S_φ on the (k, τ) grid;
2. ``bessel.BesselTable.cached`` — j_ℓ, j_ℓ' at the sampled ℓ (host, scipy; kept in the process
   and in the persistent cache);
3. ``line_of_sight.transfer_functions`` — Δ_ℓ^T, Δ_ℓ^E, Δ_ℓ^φ on the fine k grid, each ℓ over
   its window of it (``sampling.transfer_window``);
4. ``spectra.cl_from_transfers`` (+ ``limber_pp``) and the ℓ spline to every ℓ ≤ l_max;
5. with ``lensing``: the unlensed spectra to ``lensing.input_l_max(l_max)``, then
   ``lensing.lensed_spectra`` (all-sky correlation functions) to l_max.

``cl_for_config(config)`` runs stage 1 (tables) and this stage for a config's cosmology.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from solver.caches import Cache

from ..runtime import require_float64
from .bessel import BesselTable
from .lensing import input_l_max, lensed_spectra
from .line_of_sight import transfer_functions
from .sampling import ClSampling, multipoles, transfer_wavenumbers, transfer_window
from .sources import compute_sources
from .spectra import ClSpectra, cl_from_transfers, ell_spline_matrix, limber_pp

__all__ = ["compute_cl", "cl_for_config", "config_tables", "check_request", "sampled_spectra",
           "every_ell", "method_breaks", "sampled_multipoles",
           "SPECTRA", "L_MAX_RANGE", "L_LIMBER", "L_LATE"]

#: the spectra a run can ask for (config output.cl)
SPECTRA = ("TT", "EE", "TE", "BB", "PP")
#: supported l_max
L_MAX_RANGE = (30, 5000)
#: the lensing potential: full line of sight up to this ℓ, Limber above
L_LIMBER = 100
#: late sources (z < 30) enter the temperature and polarisation up to this ℓ
L_LATE = 400
#: ``every_ell``'s spline matrices on the device, per (sampled ℓ, l_max, breaks, degree): a
#: (l_max - 1) × L matrix costs milliseconds of scipy and an upload of megabytes per call
_ELL_MATRICES = Cache("boltzmann.cmb.ell_matrices", maxsize=8)


def check_request(l_max: int, spectra, lensing: bool) -> None:
    """A clear error for an l_max outside ``L_MAX_RANGE``, an unknown spectrum, or lensing
    without the lensing potential."""
    if not L_MAX_RANGE[0] <= int(l_max) <= L_MAX_RANGE[1]:
        raise ValueError(f"l_max = {l_max}: supported range is {L_MAX_RANGE[0]}..{L_MAX_RANGE[1]}")
    unknown = set(spectra) - set(SPECTRA)
    if unknown:
        raise ValueError(f"unknown spectra {sorted(unknown)}; choose from {SPECTRA}")
    if lensing and "PP" not in spectra:
        raise ValueError("lensing needs the lensing potential: add PP to output.cl")


def compute_cl(tables, cosmos, precision, model, *, l_max: int = 2500,
               spectra=("TT", "EE", "TE", "PP"), lensing: bool = False,
               sampling: ClSampling = ClSampling(), backend="auto",
               los_batch: int | None = None) -> ClSpectra:
    """C_ℓ of the first cosmology of ``tables``/``cosmos`` (a stacked CosmoParams) for every
    ℓ = 2..l_max; see the module docstring and docs/cmb.md. ``los_batch``: multipoles per
    iteration of the line of sight (None: ``line_of_sight.multipole_batch``)."""
    require_float64()
    check_request(l_max, spectra, lensing)
    l_out = int(l_max)
    if lensing:
        l_max = input_l_max(l_out)
    timings = {}
    t0 = time.perf_counter()
    src = compute_sources(tables, cosmos, precision, model, int(l_max), sampling=sampling,
                          lensing_modes="PP" in spectra, backend=backend)
    jax.block_until_ready((src.t0, src.t1, src.t2, src.e, src.phi))
    timings["sources"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ells = sampled_multipoles(int(l_max), sampling)
    k = transfer_wavenumbers(src.k[:src.n_cmb or src.k.size], src.tau0, sampling)
    table = BesselTable.cached(ells, float(k[-1] * src.tau0) + 1.0)
    timings["bessel"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    l_limber = min(L_LIMBER, int(l_max))
    window = transfer_window(ells, k, src.tau, src.tau0, src.tau_rec, sampling)
    tr = transfer_functions(src, ells, k, table, l_late=L_LATE, l_limber=l_limber,
                            window=window, spline_degree=sampling.k_spline_degree,
                            batch=los_batch)
    jax.block_until_ready((tr.T, tr.E, tr.P))     # each stage's seconds its own
    timings["line_of_sight"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    A_s, n_s, k_pivot = (jnp.asarray(getattr(cosmos, n))[0] for n in ("A_s", "n_s", "k_pivot"))
    T_cmb = float(np.asarray(cosmos.T_cmb)[0])
    sampled = sampled_spectra(tr, src, A_s, n_s, k_pivot, T_cmb=T_cmb, l_limber=l_limber,
                              with_pp="PP" in spectra)
    names = [n for n in ("TT", "EE", "TE", "PP") if n in spectra or lensing]
    cl = {n: np.asarray(v) for n, v in every_ell(sampled, ells, int(l_max), names,
                                                            sampling.l_spline_degree).items()}
    timings["spectra"] = time.perf_counter() - t0
    ell_all = np.arange(2, int(l_max) + 1)
    lensed = None
    if lensing:
        t0 = time.perf_counter()
        lensed = {name: np.asarray(v)
                  for name, v in lensed_spectra(ell_all, cl, l_out, method="auto").items()}
        timings["lensing"] = time.perf_counter() - t0
    keep = ell_all <= l_out
    cl = {name: v[keep] for name, v in cl.items() if name in spectra}
    if "BB" in spectra:
        cl["BB"] = np.zeros(int(keep.sum()))
    info = {"k_source": int(src.k.size), "tau_samples": int(src.tau.size),
            "k_transfer": int(k.size), "ell_sampled": int(ells.size),
            "solver_steps_max": int(np.max(src.n_accepted)),
            "solver_failures": int(np.sum(src.status != 0))}
    return ClSpectra(ell=ell_all[keep], cl=cl, lensed=lensed, T_cmb=T_cmb, timings=timings,
                     info=info)


def sampled_spectra(tr, src, A_s, n_s, k_pivot, *, T_cmb: float, l_limber: int,
                    with_pp: bool, tau_fid=None, tau0_fid=None) -> dict:
    """{TT, EE, TE [, PP]} at the sampled ℓ from the transfer functions ``tr`` of the sources
    ``src``: the k integral, and C_ℓ^φφ by Limber above ``l_limber`` (traceable; ``tau_fid``,
    ``tau0_fid`` as in ``spectra.limber_pp``)."""
    sampled = cl_from_transfers(tr, A_s, n_s, k_pivot, T_cmb=T_cmb)
    if with_pp:
        high = tr.ells[tr.ells > l_limber]
        if high.size:
            sampled["PP"] = jnp.concatenate([sampled["PP"], limber_pp(
                src, high, A_s, n_s, k_pivot, tau_fid=tau_fid, tau0_fid=tau0_fid)])
    return sampled


def method_breaks(l_max: int) -> dict:
    """{spectrum: the ℓ after which its computation changes method}: the late sources end at
    ``L_LATE`` for TT, EE, TE; Limber's C_ℓ^φφ starts after ``L_LIMBER``. ``multipoles`` samples
    both sides of each and ``every_ell`` splines each side apart."""
    late = (L_LATE,) if L_LATE < l_max else ()
    limber = (L_LIMBER,) if L_LIMBER < l_max else ()
    return {"TT": late, "EE": late, "TE": late, "PP": limber}


def sampled_multipoles(l_max: int, sampling: ClSampling = ClSampling()) -> np.ndarray:
    """The multipoles whose transfer functions a run computes (``multipoles`` with both sides
    of every ``method_breaks`` ℓ)."""
    breaks = sorted({b for bs in method_breaks(int(l_max)).values() for b in bs})
    return multipoles(int(l_max), sampling, breaks=breaks)


def every_ell(sampled: dict, ells, l_max: int, names,
              degree: int = ClSampling.l_spline_degree) -> dict:
    """{name: (l_max - 1,)} C_ℓ at every ℓ = 2..l_max: the spline of ``degree`` of ℓ(ℓ+1)C_ℓ
    through the sampled ℓ, apart on each side of the spectrum's ``method_breaks`` (one fixed
    matrix per spectrum; traceable)."""
    f_s = jnp.asarray(ells * (ells + 1.0))
    ell_all = np.arange(2, int(l_max) + 1)
    f_all = jnp.asarray(ell_all * (ell_all + 1.0))
    breaks = method_breaks(int(l_max))
    out = {}
    for name in names:
        key = breaks.get(name, ())
        matrix = _ELL_MATRICES.get_or_build(
            (np.asarray(ells).tobytes(), int(l_max), key, int(degree)),
            lambda key=key: _device_matrix(ell_spline_matrix(ells, int(l_max), breaks=key,
                                                             degree=degree)))
        out[name] = (matrix @ (f_s * sampled[name])) / f_all
    return out


def _device_matrix(m: np.ndarray):
    """``m`` on the default device, concrete even when called inside a trace (a cached array
    must not be a tracer)."""
    with jax.ensure_compile_time_eval():
        return jnp.asarray(m)


def config_tables(config):
    """(stacked cosmology, model, grid, tables) of ``config``'s one cosmology: what stage 1
    gives the C_ℓ stage (``compute_cl``, the sources' and convergence tools)."""
    from .. import modes
    from ..ensemble import stack_cosmologies
    from ..tables import compute_tables

    stacked = stack_cosmologies([config.cosmology])
    model = modes.model_for(config.cosmology, config.precision)
    grid = modes.make_grid(config.precision)
    return stacked, model, grid, compute_tables(stacked, grid, model)


def cl_for_config(config, *, l_max: int | None = None, spectra=None, lensing=None,
                  sampling: ClSampling = ClSampling(), backend="auto",
                  los_batch: int | None = None) -> ClSpectra:
    """Tables and C_ℓ for ``config`` (a boltzmann.params.Config); arguments left None come from
    its output block (``cl``, ``l_max``, ``lensing``); ``los_batch`` as ``compute_cl``'s."""
    out = config.output
    l_max = int(getattr(out, "l_max", 2500) if l_max is None else l_max)
    spectra = tuple(getattr(out, "cl", ()) or ("TT", "EE", "TE", "PP")) if spectra is None \
        else tuple(spectra)
    lensing = bool(getattr(out, "lensing", False)) if lensing is None else bool(lensing)
    stacked, model, _, tables = config_tables(config)
    return compute_cl(tables, stacked, config.precision, model, l_max=l_max, spectra=spectra,
                      lensing=lensing, sampling=sampling, backend=backend, los_batch=los_batch)
