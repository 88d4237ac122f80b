"""The stage driver: spectra of one cosmology or many, through one solver launch.

``run_ensemble(cosmologies, precision, output)`` composes the stages for a list of
``CosmoParams`` that share one species structure (same number of ncdm species, same Λ/fluid
choice — they then share one generated perturbation model):

1. ``tables.compute_tables`` — background + thermodynamics of every cosmology at once;
2. ``perturbations.compute_perturbations`` — every solved (cosmology, k) mode in one ensemble
   solve: every mode of the k axis, or with ``precision.k_solve_stride`` > 1 the sparser
   sampling above ``k_solve_dense_below`` that ``k_sampling.choose`` picks;
3. ``spectra.compute_spectra`` — P_m, P_cb (filled in by the sampling's spline at the modes not
   solved) and σ8 per cosmology.

A single cosmology is an ensemble of one (``boltzmann.pipeline.run``), so the two cannot
disagree. The compiled programs of every stage are cached per model and grid, so a second call
with the same number of cosmologies and k pays no compilation.

``fiducial_ensemble(n)`` makes a deterministic Latin-hypercube spread of cosmologies around a
config's fiducial (benchmarks: scripts/bench_gpu.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import k_sampling, modes
from .params import Config, CosmoParams, load_config
from .perturbations import MAX_STEPS, Transfers, compute_perturbations
from .progress import null_progress
from .runtime import require_float64
from .spectra import Spectra, compute_spectra, on_requested_k
from .tables import Tables, compute_tables

__all__ = ["Result", "StructureMismatch", "run_ensemble", "run_config_ensemble",
           "fiducial_ensemble", "stack_cosmologies", "check_structure", "SPREAD_PARAMETERS"]

#: parameters varied by ``fiducial_ensemble`` (relative ±spread each)
SPREAD_PARAMETERS = ("omega_b", "omega_cdm", "h", "n_s", "A_s")


class StructureMismatch(ValueError):
    """Cosmologies of one launch differ in species structure (ncdm count, Λ vs fluid)."""


@dataclass
class Result:
    """Everything computed for C cosmologies (C = 1 for ``pipeline.run``).

    cosmologies: the C CosmoParams; tables (stage 1), transfers (stage 2: fields (C, Z, K') on
    their own ``transfers.k``: the solved modes among the requested ones, all of them unless
    ``precision.k_solve_stride`` > 1), spectra (stage 3: P(k) (C, Z, K), σ8 (C, Z)) on the
    requested k (``k``), all at ``z`` (``output.z``,
    then the ``output.z_background`` redshifts not among them); timings: seconds per stage (tables,
    perturbations, spectra, total, and gradients when computed; ``transfers.timings`` splits the
    perturbations); gradients: with
    ``pipeline.run(gradients=True)``, ``boltzmann.gradients.PowerSpectrumFunction.dlnpk()``'s
    tables and a JSON-able summary under ``gradients["summary"]``.
    """

    cosmologies: list
    tables: Tables
    transfers: Transfers
    spectra: Spectra
    timings: dict
    gradients: dict | None = None
    #: CMB spectra (boltzmann.cmb.ClSpectra) when the config's output.cl asks for them
    cl: object | None = None
    #: with gradients and output.cl: ``boltzmann.cmb.ClFunction.dcl()``'s table (dcl.csv)
    cl_gradients: dict | None = None

    @property
    def k(self) -> np.ndarray:
        """(C, K) wavenumbers [1/Mpc] of P(k) (the transfers' own are ``transfers.k``: fewer
        with ``precision.k_solve_stride`` > 1)."""
        return self.spectra.k

    @property
    def z(self) -> tuple:
        return self.transfers.z

    @property
    def backend(self) -> str:
        return self.transfers.backend

    @property
    def n_cosmologies(self) -> int:
        return len(self.cosmologies)

    def failures(self) -> list[tuple[int, float, str]]:
        """(cosmology index, k [1/Mpc], reason) of every failed mode."""
        return self.transfers.failures()

    def failure_message(self, shown: int = 8) -> str | None:
        """One line naming the failed modes (the first ``shown`` k) and the first reason, or None
        when every mode finished: what the facades raise or log for a failed point."""
        failed = self.failures()
        if not failed:
            return None
        ks = ", ".join(f"{k:.4g}" for _, k, _ in failed[:shown])
        return (f"the perturbation solve failed for {len(failed)} k modes (k = {ks} 1/Mpc): "
                f"{failed[0][2]}")

    def ok(self) -> np.ndarray:
        """(C,) True where every mode of the cosmology finished."""
        return np.all(self.transfers.status == 0, axis=1)

    def solver_stats(self) -> dict:
        """Launch statistics (step counts, failures, backend numbers) and the state size."""
        return {"n_cosmologies": self.n_cosmologies, "n_k": int(self.k.shape[1]),
                "tables_device": self.tables.device, **self.transfers.stats()}


# --------------------------------------------------------------------------- structure
def _structure(cosmo: CosmoParams):
    leaves, treedef = jax.tree_util.tree_flatten(cosmo)
    return treedef, tuple(np.shape(x) for x in leaves)


def _describe_structure(cosmo: CosmoParams) -> str:
    de = (("w0-wa fluid, " + ("PPF" if cosmo.use_ppf else f"rest frame c_s^2 = {cosmo.cs2_fld:g}"))
          if cosmo.use_fld else "Lambda")
    return f"{cosmo.n_ncdm} ncdm species, {de}"


def check_structure(cosmologies: Sequence[CosmoParams]) -> None:
    """Raise StructureMismatch unless all cosmologies share one species structure."""
    if len(cosmologies) == 0:
        raise ValueError("run_ensemble: need at least one cosmology")
    for i, c in enumerate(cosmologies):
        if not isinstance(c, CosmoParams):
            raise TypeError(f"run_ensemble: cosmology {i} is a {type(c).__name__}, expected "
                            f"boltzmann.params.CosmoParams")
    ref = _structure(cosmologies[0])
    for i, c in enumerate(cosmologies[1:], start=1):
        if _structure(c) != ref:
            raise StructureMismatch(
                f"run_ensemble: cosmology {i} has {_describe_structure(c)} but cosmology 0 has "
                f"{_describe_structure(cosmologies[0])}; all cosmologies of one launch must share "
                f"the species structure (number of ncdm species and Lambda vs fluid), because they "
                f"share one perturbation model. Split the list by structure and call run_ensemble "
                f"once per group.")


def stack_cosmologies(cosmologies: Sequence[CosmoParams]) -> CosmoParams:
    """One CosmoParams whose leaves carry a leading cosmology axis (for jax.vmap)."""
    check_structure(cosmologies)

    def stack(*xs):
        try:  # concrete values: stack on the host, one transfer per leaf
            return jnp.asarray(np.stack([np.asarray(x, np.float64) for x in xs]))
        except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
            return jnp.stack([jnp.asarray(x, jnp.float64) for x in xs])

    return jax.tree_util.tree_map(stack, *cosmologies)


# --------------------------------------------------------------------------- the driver
def run_ensemble(cosmologies: Sequence[CosmoParams], precision, output, *,
                 backend="auto", progress=null_progress, check_sigma8_coverage: bool = True,
                 max_steps: int = MAX_STEPS) -> Result:
    """P_m, P_cb, σ8 and transfer functions of every cosmology, with one solver launch.

    cosmologies: CosmoParams with one species structure (else StructureMismatch);
    precision: a PrecisionSpec; output: an OutputSpec (redshifts and k grid, shared; a grid in
    h/Mpc is the same in h/Mpc for every cosmology); backend: "jax", "cuda", "auto" or a solver
    backend object; progress: callback (stage, done, total);
    check_sigma8_coverage: solve the extra modes σ8 needs beyond a short requested k range
    (``modes.sigma8_grid``; P(k) and transfers are reported on the requested grid only) and list
    σ8 values whose k range is still too narrow in ``spectra.problems``.
    Redshifts: ``output.z``, then ``output.z_background``'s others (``OutputSpec.z_solve``).
    Failed modes are reported in ``result.failures()`` (their P and the cosmology's σ8 are NaN;
    with ``precision.k_solve_stride`` > 1 so are the P filled in from the solved modes).
    """
    require_float64()
    t_start = time.perf_counter()
    cosmologies = list(cosmologies)
    stacked = stack_cosmologies(cosmologies)
    model = modes.model_for(cosmologies[0], precision)
    grid = modes.make_grid(precision)
    timings = {}

    t0 = time.perf_counter()
    progress("tables", 0, 1)
    tables = compute_tables(stacked, grid, model)
    progress("tables", 1, 1)
    timings["tables"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    k = np.stack([np.asarray(output.k_grid(float(c.h)), np.float64) for c in cosmologies])
    k_h = output.k_grid(1.0) if output.k_values is None else None
    keep = np.arange(k.shape[1])
    if check_sigma8_coverage:  # σ8 gets the k range it needs, P(k) stays on the requested grid
        k, k_h, keep = modes.sigma8_grid(k, k_h, [float(c.h) for c in cosmologies])
    # one sampling for all: the cosmologies share one k axis
    sampling = k_sampling.choose(k, k_h, [float(c.h) for c in cosmologies], precision)
    transfers = compute_perturbations(tables, stacked, sampling.k_solved, output.z_solve,
                                      precision, model, k_h=sampling.k_h_solved, backend=backend,
                                      progress=progress, max_steps=max_steps)
    timings["perturbations"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    spectra = compute_spectra(transfers, stacked, check_coverage=check_sigma8_coverage,
                              sampling=sampling)
    transfers, spectra = on_requested_k(transfers, spectra, keep, sampling)
    timings["spectra"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    return Result(cosmologies=cosmologies, tables=tables, transfers=transfers, spectra=spectra,
                  timings=timings)


def run_config_ensemble(config: Config | str, cosmologies: Sequence[CosmoParams], **kwargs):
    """``run_ensemble`` with the precision and output blocks of a config (path, name or Config)."""
    cfg = config if isinstance(config, Config) else load_config(config)
    return run_ensemble(cosmologies, cfg.precision, cfg.output, **kwargs)


# --------------------------------------------------------------------------- benchmark sets
def fiducial_ensemble(n: int, config: Config | str = "lcdm", *, spread: float = 0.05,
                      seed: int = 0, include_fiducial: bool = True,
                      parameters: Sequence[str] = SPREAD_PARAMETERS) -> list:
    """``n`` cosmologies around a config's fiducial, deterministic for a given ``seed``.

    A Latin hypercube in ``parameters`` (default omega_b, omega_cdm, h, n_s, A_s), each varied
    by a relative ±``spread``; everything else (neutrino mass, τ_reio, ...) stays at the
    fiducial. With ``include_fiducial`` the first cosmology is the fiducial itself.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"spread must be in [0, 1), got {spread}")
    cfg = config if isinstance(config, Config) else load_config(config)
    fid = cfg.cosmology
    for name in parameters:
        if name not in CosmoParams.__dataclass_fields__ or np.ndim(getattr(fid, name)) != 0:
            raise ValueError(f"cannot vary {name!r}: not a scalar CosmoParams field")
    out = [fid] if include_fiducial else []
    m = n - len(out)
    if m > 0:
        rng = np.random.default_rng(seed)
        d = len(parameters)
        # Latin hypercube: in each dimension one point per stratum, strata shuffled
        u = (np.stack([rng.permutation(m) for _ in range(d)], axis=1)
             + rng.random((m, d))) / m
        for row in u:
            changes = {name: float(getattr(fid, name)) * (1.0 + spread * (2.0 * x - 1.0))
                       for name, x in zip(parameters, row)}
            out.append(dataclasses.replace(fid, **changes))
    # flatness leaves Omega_de = 1 - (omega_b + omega_cdm + omega_ncdm + omega_r) / h^2 >= 0;
    # omega_ncdm + omega_r is the fiducial's unless a parameter it depends on is varied
    fixed_rest = not set(parameters) & {"T_cmb", "N_ur"}
    rest = float(fid.omega_ncdm_tot + fid.omega_r) if fixed_rest else None
    for i, c in enumerate(out):
        if fixed_rest:
            omega_de = 1.0 - (float(c.omega_b) + float(c.omega_cdm) + rest) / float(c.h) ** 2
        else:
            omega_de = float(c.Omega_de)
        if not math.isfinite(omega_de) or omega_de < 0:
            raise ValueError(f"fiducial_ensemble: cosmology {i} has Omega_de = {omega_de:.3g} "
                             f"< 0; lower the spread")
    return out
