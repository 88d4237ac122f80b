"""Many cosmologies in one solver launch: P_m(k, z), P_cb(k, z) and σ8 for a batch (DESIGN §7).

``run_ensemble(cosmologies, precision, output, backend=...)`` computes, for a list of
``CosmoParams`` that share one species structure (same number of ncdm species, same Λ/fluid
choice — they then share one generated perturbation model):

1. **tables** — background + thermodynamics for every cosmology at once: ``jax.jit(jax.vmap(...))``
   of ``thermodynamics.compute_thermodynamics`` and ``perturbations.build_table`` over the stacked
   ``CosmoParams`` pytree (both are traceable in every leaf), giving ``tab[cosmo_row, column, 0|1,
   node]`` in the models/tables.py layout;
2. **initial conditions** — parameter rows for every (cosmology, k) from
   ``perturbations.mode_param_rows`` (vmapped over cosmologies; the ``cosmo_row`` column points at
   the cosmology's table) and the adiabatic initial states of ``models.initial_conditions``; the
   trajectories are packed k-major — sorted by k, cosmologies adjacent at (nearly) equal k — so
   that neighbouring trajectories (one GPU warp) have similar step counts;
3. **solve** — ONE ``solver.solve`` call over all C × K trajectories (``backend`` passed through);
4. **spectra** — the model's observables (vmapped, as boltzmann.pipeline does), then
   ``spectra.power_from_transfer`` and σ8 (vmapped ``spectra.sigma_R``) per cosmology.

Per-trajectory the arithmetic is the single-cosmology pipeline's (same model, tables, parameter
rows, initial states, tolerances and error weights), so each P(k) equals ``pipeline.run``'s to
rounding (tests/test_ensemble.py). The jitted stage functions are cached per (model, grid), so a
second call with the same number of cosmologies and k pays no compilation ("warm").

``fiducial_ensemble(n)`` makes a deterministic Latin-hypercube spread of cosmologies around a
config's fiducial (benchmarks: scripts/bench_gpu.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from solver import solve
from solver.status import describe

from . import perturbations as pt
from . import spectra
from .params import Config, CosmoParams, load_config
from .pipeline import compute_tables, host_cpu
from .thermodynamics import compute_thermodynamics

__all__ = ["EnsembleResult", "StructureMismatch", "run_ensemble", "fiducial_ensemble",
           "stack_cosmologies", "SPREAD_PARAMETERS"]

#: parameters varied by ``fiducial_ensemble`` (relative ±spread each)
SPREAD_PARAMETERS = ("omega_b", "omega_cdm", "h", "n_s", "A_s")
#: the single-cosmology pipeline's step limit
MAX_STEPS = 200_000
#: most cosmologies per compiled (vmapped) tables program; larger batches run in pieces
TABLE_CHUNK = 128
#: up to this many cosmologies the tables are computed on the host CPU when the default device is
#: a GPU (the scan is latency-bound there: 0.72-0.79 s for 1-128 cosmologies on the H200; on a
#: 2-core CPU 0.09 s for one, 0.73 s for 16, 5.2 s for 128 -- 2026-11-30)
HOST_TABLES_MAX = 16


class StructureMismatch(ValueError):
    """Cosmologies of one launch differ in species structure (ncdm count, Λ vs fluid)."""


@dataclass
class EnsembleResult:
    """Spectra of C cosmologies on K wavenumbers each, from one solver launch.

    k: (C, K) wavenumbers [1/Mpc] (``output.k_grid(h)`` per cosmology: a grid given in h/Mpc
    differs between cosmologies in 1/Mpc); z: the output redshifts;
    pk_m, pk_cb: {z: (C, K)} linear P(k) [Mpc^3] of all matter (cdm + b + ncdm) and of cdm + b;
    sigma8, sigma8_cb: {z: (C,)}; transfers: {z: {CLASS name: (C, K)}} (the model's observables);
    derived: {name: (C,)} thermodynamic numbers (z_reio, z_rec, z_star, z_drag);
    solver_stats: launch statistics; failed: [(cosmology index, k, reason)] of failed modes (their
    P is NaN and the cosmology's σ8 too); timings: seconds per stage (tables, initial_conditions,
    solve, spectra, total); sigma8_problems: k-coverage warnings of σ8 (``check_sigma8_coverage``).
    """

    cosmologies: list
    k: np.ndarray
    z: list
    pk_m: dict
    pk_cb: dict
    sigma8: dict
    sigma8_cb: dict
    transfers: dict
    derived: dict
    backend: str
    solver_stats: dict
    failed: list
    timings: dict
    sigma8_problems: list = field(default_factory=list)

    @property
    def n_cosmologies(self) -> int:
        return len(self.cosmologies)

    @property
    def n_trajectories(self) -> int:
        return int(self.k.size)

    def ok(self) -> np.ndarray:
        """(C,) True where every mode of the cosmology finished."""
        good = np.ones(self.n_cosmologies, bool)
        for c, _, _ in self.failed:
            good[c] = False
        return good


# --------------------------------------------------------------------------- structure
def _structure(cosmo: CosmoParams):
    leaves, treedef = jax.tree_util.tree_flatten(cosmo)
    return treedef, tuple(np.shape(x) for x in leaves)


def _describe_structure(cosmo: CosmoParams) -> str:
    de = "w0-wa fluid" if cosmo.use_fld else "Lambda"
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


# --------------------------------------------------------------------------- cached pieces
_FUNCTIONS: dict = {}


def _model(cosmo: CosmoParams, precision):
    """The generated model for this structure and precision (perturbations.build_model caches it
    per structure, so the solver's plan, keyed by the RHS object, is reused across calls)."""
    return pt.build_model(cosmo, precision)


@dataclass
class _Functions:
    tables: Any
    rows: Any
    observables: Any


def _functions(model, grid: pt.Grid) -> _Functions:
    key = (id(model), grid)
    fns = _FUNCTIONS.get(key)
    if fns is not None:
        return fns
    nodes = grid.nodes

    def tables_one(cosmo):
        thermo = compute_thermodynamics(cosmo, lna_grid=nodes)
        tab = pt.build_table(cosmo, thermo, grid, model)
        derived = {"z_reio": thermo.z_reio, "z_rec": thermo.z_rec, "z_star": thermo.z_star,
                   "z_drag": thermo.z_drag}
        return tab, derived

    rows = None
    if hasattr(pt, "mode_param_rows"):
        # k and cosmo_row are concrete structure there: pass placeholders, fill them afterwards
        def rows_all(stacked, n_k):
            return jax.vmap(lambda c: pt.mode_param_rows(model, c, np.ones(n_k), grid, 0))(
                stacked)

        rows = jax.jit(rows_all, static_argnums=1)

    obs = jax.vmap(jax.vmap(model.observables, in_axes=(0, 0, None, None)),
                   in_axes=(0, None, 0, None))
    fns = _Functions(tables=jax.jit(jax.vmap(tables_one)), rows=rows, observables=jax.jit(obs))
    _FUNCTIONS[key] = fns
    return fns


def _tables_in_chunks(tables_fn, stacked, C: int, chunk: int | None = None):
    """``tables_fn`` (jit of vmap) over C cosmologies in pieces of at most ``chunk``.

    On the H200, XLA's GPU compile of the vmapped tables stalled at 1024 cosmologies ("very slow
    compile" of one reduction fusion, > 2 min, 2026-11-30) while 128 compiled in 23 s; the
    tables stage is a sequential scan whose time hardly depends on the batch (0.72-0.79 s for
    1-128 cosmologies on the H200), so pieces of TABLE_CHUNK cost one such scan each.  The last
    piece is padded by repeating the last cosmology, so every piece reuses ONE compiled program.
    """
    chunk = TABLE_CHUNK if chunk is None else int(chunk)
    if C <= chunk:
        tab, derived = tables_fn(stacked)
        return tab.block_until_ready(), {name: np.asarray(v) for name, v in derived.items()}
    tabs, ders = [], []
    for start in range(0, C, chunk):
        idx = np.minimum(np.arange(start, start + chunk), C - 1)
        piece = jax.tree_util.tree_map(
            lambda x: x[idx] if getattr(x, "ndim", 0) >= 1 else x, stacked)
        tab, derived = tables_fn(piece)
        n = min(chunk, C - start)
        tabs.append(tab[:n])
        ders.append({name: np.asarray(v)[:n] for name, v in derived.items()})
    tab = jnp.concatenate(tabs).block_until_ready()
    return tab, {name: np.concatenate([d[name] for d in ders]) for name in ders[0]}


def _param_rows(fns, model, cosmologies, stacked, k, grid) -> np.ndarray:
    """(C, K, P) parameter rows; the cosmo_row column is the cosmology's index."""
    C, K = k.shape
    ik, ir = model.param_index("k"), model.param_index("cosmo_row")
    if fns.rows is not None:
        rows = np.array(fns.rows(stacked, K))
        rows[:, :, ik] = k
        rows[:, :, ir] = np.arange(C)[:, None]
        return rows
    return np.stack([pt.mode_params(model, c, k[i], grid, cosmo_row=i)
                     for i, c in enumerate(cosmologies)])


# --------------------------------------------------------------------------- σ8
def _sigma8_batch(k: np.ndarray, pk: np.ndarray, h: np.ndarray, output) -> np.ndarray:
    """σ8 of every row of pk (C, K) on k (C, K) [1/Mpc], by one vmapped spectra.sigma_R.

    A k grid given in h/Mpc (the usual case) is the same grid q = k/h for every cosmology, and
    σ(8 Mpc/h) = σ_R(q, h³ P, R = 8) exactly (Δ² and W(kR) depend on k/h and kR = 8 q only), with
    the same fine sampling as spectra.sigma8 for one cosmology. A k grid given in 1/Mpc
    (k_file) is shared as is; R = 8/h then varies and the sampling is set by the largest R.
    """
    pk = jnp.asarray(pk)
    if output.k_values is None:
        q = output.k_grid(1.0)
        fn = jax.vmap(lambda p: spectra.sigma_R(q, p, 8.0, check_coverage=False))
        return np.asarray(fn(pk * jnp.asarray(h)[:, None] ** 3))
    R = 8.0 / np.asarray(h)
    fn = jax.vmap(lambda p, r: spectra.sigma_R(k[0], p, r, check_coverage=False,
                                               R_max_sampling=float(R.max())))
    return np.asarray(fn(pk, jnp.asarray(R)))


# --------------------------------------------------------------------------- the driver
def run_ensemble(cosmologies: Sequence[CosmoParams], precision, output, *,
                 backend: str = "jax", check_sigma8_coverage: bool = True,
                 max_steps: int = MAX_STEPS) -> EnsembleResult:
    """P_m, P_cb, σ8 and transfer functions for every cosmology, with ONE solver launch.

    cosmologies: CosmoParams with one species structure (else StructureMismatch);
    precision: a PrecisionSpec; output: an OutputSpec (redshifts and k grid, shared);
    backend: "jax", "cuda" or "auto" (passed to solver.solve);
    check_sigma8_coverage: run spectra.check_sigma_k_coverage for every cosmology and redshift
    (host-side numpy; ~ms per cosmology) and list problems in ``sigma8_problems``.
    """
    t_start = time.perf_counter()
    cosmologies = list(cosmologies)
    check_structure(cosmologies)
    C = len(cosmologies)
    timings = {}

    # ---- 1. background + thermodynamics tables, all cosmologies at once
    t0 = time.perf_counter()
    model = _model(cosmologies[0], precision)
    grid = pt.make_grid(precision)
    fns = _functions(model, grid)
    stacked = stack_cosmologies(cosmologies)
    # few cosmologies: the sequential table scan is faster on the host (pipeline.host_cpu)
    on_host = C <= HOST_TABLES_MAX and host_cpu() is not None
    tab, derived = compute_tables(lambda st: _tables_in_chunks(fns.tables, st, C), stacked,
                                  on_host=on_host)
    tables_device = "cpu" if on_host else jax.default_backend()
    timings["tables"] = time.perf_counter() - t0

    # ---- 2. parameter rows and initial states, packed k-major
    t0 = time.perf_counter()
    h = np.array([float(c.h) for c in cosmologies])
    k = np.stack([np.asarray(output.k_grid(float(hh)), np.float64) for hh in h])  # (C, K)
    K = k.shape[1]
    zs = [float(z) for z in output.z]
    x_save = np.sort(-np.log1p(np.asarray(zs)))
    rows = _param_rows(fns, model, cosmologies, stacked, k, grid).reshape(C * K, -1)
    cosmo_of = np.repeat(np.arange(C), K)
    order = np.lexsort((cosmo_of, k.reshape(-1)))  # by k, then cosmology
    params = rows[order]
    x0, y0 = pt.initial_states(model, params, precision.k_tau_ini, precision.omega_tau_ini)
    if np.any(x0 < grid.x_min):
        raise ValueError(f"precision.bg_a_min = {precision.bg_a_min:g} is above the initial scale "
                         f"factor of the largest k ({np.exp(x0.min()):.3g}); lower it")
    if np.any(x0[:, None] > x_save[None, :]):
        raise ValueError("a requested redshift lies before the perturbations start; "
                         f"max z allowed here is {np.expm1(-x0.max()):.3g}")
    weights = pt.error_weights(model)
    timings["initial_conditions"] = time.perf_counter() - t0

    # ---- 3. one solver launch over all (cosmology, k)
    t0 = time.perf_counter()
    sol = solve(model.rhs, y0, x_save, params, args=tab, t0=x0, rtol=precision.rtol,
                atol=precision.atol, error_weights=weights, backend=backend,
                max_steps=int(max_steps))
    ys = sol.ys
    if isinstance(ys, jax.Array):
        ys.block_until_ready()
    status = np.asarray(sol.status)
    n_acc = np.asarray(sol.n_accepted)
    n_rej = np.asarray(sol.n_rejected)
    timings["solve"] = time.perf_counter() - t0

    # ---- 4. observables, P(k), σ8 per cosmology
    t0 = time.perf_counter()
    obs = fns.observables(jnp.asarray(ys), jnp.asarray(x_save), jnp.asarray(params), tab)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    transfers = {}
    for iz, x in enumerate(x_save):
        z = float(np.expm1(-x))
        zkey = min(zs, key=lambda zz: abs(zz - z))
        transfers[zkey] = {name: np.asarray(v[:, iz])[inverse].reshape(C, K)
                           for name, v in obs.items()}
    A_s = np.array([float(c.A_s) for c in cosmologies])[:, None]
    n_s = np.array([float(c.n_s) for c in cosmologies])[:, None]
    k_pivot = np.array([float(c.k_pivot) for c in cosmologies])[:, None]
    pk_m, pk_cb, s8, s8_cb, problems = {}, {}, {}, {}, []
    for z in zs:
        for name, pks, sig in (("d_m", pk_m, s8), ("d_cb", pk_cb, s8_cb)):
            pk = np.asarray(spectra.power_from_transfer(k, transfers[z][name], A_s, n_s, k_pivot))
            pks[z] = pk
            good = np.all(np.isfinite(pk) & (pk > 0), axis=1)
            s = np.full(C, np.nan)
            if good.any():
                try:
                    s[good] = _sigma8_batch(k[good], pk[good], h[good], output)
                except ValueError as exc:  # e.g. fewer than 5 wavenumbers: no σ8, still P(k)
                    problems.append(f"{name}, z = {z:g}: no sigma8: {exc}")
            sig[z] = s
            if check_sigma8_coverage:
                for c in np.flatnonzero(good):
                    try:
                        spectra.check_sigma_k_coverage(k[c], pk[c], 8.0 / h[c])
                    except spectra.KRangeError as exc:
                        problems.append(f"cosmology {c}, {name}, z = {z:g}: {exc}")
    timings["spectra"] = time.perf_counter() - t0

    failed = [(int(cosmo_of[order[i]]), float(params[i, model.param_index("k")]),
               describe(status[i])) for i in np.flatnonzero(status != 0)]
    stats = {
        "backend": sol.backend,
        "n_cosmologies": C,
        "tables_device": tables_device,
        "n_k": K,
        "trajectories": int(C * K),
        "state_size": int(model.n),
        "accepted_steps_median": float(np.median(n_acc)),
        "accepted_steps_max": int(n_acc.max()),
        "steps_total": int(n_acc.sum() + n_rej.sum()),
        "rejected_steps_total": int(n_rej.sum()),
        "n_failed": len(failed),
        "rtol": float(precision.rtol),
        "atol": float(precision.atol),
        **{key: val for key, val in sol.info.items() if isinstance(val, (int, float, str))},
    }
    timings["total"] = time.perf_counter() - t_start
    return EnsembleResult(cosmologies=cosmologies, k=k, z=zs, pk_m=pk_m, pk_cb=pk_cb,
                          sigma8=s8, sigma8_cb=s8_cb, transfers=transfers, derived=derived,
                          backend=sol.backend, solver_stats=stats, failed=failed,
                          timings=timings, sigma8_problems=problems)


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
