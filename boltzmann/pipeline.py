"""The whole job as a sequence of stages (CLASS-style): parameters → background →
thermodynamics → perturbations → transfer functions. Spectra and σ8 are formed from the result by
``boltzmann.spectra`` (the CLI does that, and so can any caller).

``run(config)`` returns a ``PipelineResult`` whose fields are the contract with the CLI and the
output writers (boltzmann/cli.py's docstring).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from solver import solve
from solver.backends import pick_backend
from solver.status import describe

from . import perturbations as pt
from .thermodynamics import compute_thermodynamics

#: how many k-chunks the JAX backend's solve is split into (progress reporting; each chunk is one
#: launch). The CUDA backend solves all k in ONE launch: its wall time is the slowest mode's, and
#: chunks would add up (main job on the H200: 1.95 s in 4 launches vs 1.19 s in one, 2026-11-30).
N_CHUNKS = 4


def host_cpu():
    """JAX's CPU device when the default device is an accelerator, else None.

    The background + thermodynamics tables are a sequential scan over 4000 nodes: on the H200 one
    cosmology's tables took 0.75 s (~0.2 ms per node, launch latency), on a 2-core CPU 0.09 s.
    So a single cosmology's tables are computed on the host CPU and copied to the GPU.
    """
    try:
        if jax.default_backend() == "cpu":
            return None
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


def compute_tables(fn, cosmo, on_host: bool = True):
    """``fn(cosmo)`` on the host CPU when ``on_host`` and an accelerator is the default device
    (host_cpu; the result then comes back as numpy arrays), else on the default device."""
    cpu = host_cpu() if on_host else None
    if cpu is None:
        return jax.block_until_ready(fn(cosmo))
    with jax.default_device(cpu):
        # as host (numpy) arrays: later stages place them on the default device themselves
        return jax.device_get(fn(cosmo))


@dataclass
class PipelineResult:
    k: np.ndarray
    z: list
    transfers: dict
    cosmology: dict
    backend: str
    solver_stats: dict
    timings: dict
    derived: dict = field(default_factory=dict)
    #: with gradients=True: JSON-able summary (parameters, fiducial θ, ∂ln σ8/∂θ, wall time)
    gradients: dict | None = None
    #: with gradients=True: boltzmann.gradients.PowerSpectrumFunction.dlnpk()'s arrays
    gradient_tables: dict | None = None


_TABLE_FNS: dict = {}


def _tables_fn(grid, model):
    """jit(cosmo -> (ThermoTable, the model's table)) for one grid and model, compiled once."""
    key = (grid, id(model))
    fn = _TABLE_FNS.get(key)
    if fn is None:
        nodes = grid.nodes

        def tables(cosmo):
            thermo = compute_thermodynamics(cosmo, lna_grid=nodes)
            return thermo, pt.build_table(cosmo, thermo, grid, model)

        fn = _TABLE_FNS[key] = jax.jit(tables)
    return fn


def _observables_fn(model):
    """jit of the model's observables over (k, save time), compiled once per model."""
    key = ("obs", id(model))
    fn = _TABLE_FNS.get(key)
    if fn is None:
        fn = _TABLE_FNS[key] = jax.jit(jax.vmap(jax.vmap(model.observables,
                                                         in_axes=(0, 0, None, None)),
                                                in_axes=(0, None, 0, None)))
    return fn


def _noop(stage, done, total):
    pass


def run(config, *, backend: str = "auto", progress=None, gradients: bool = False) -> PipelineResult:
    """Compute transfer functions for ``config`` (a ``boltzmann.params.Config``).

    ``gradients=True`` also computes ∂ln P/∂θ and ∂ln σ8/∂θ for ``boltzmann.gradients.PARAMETERS``
    (m_ncdm only when the cosmology has massive species) on the same k grid and redshifts, by
    forward sensitivities on the JAX backend (the CUDA backend has no sensitivities yet).
    """
    progress = progress or _noop
    cosmo = config.cosmology
    prec = config.precision
    timings = {}

    t0 = time.perf_counter()
    grid = pt.make_grid(prec)
    model = pt.build_model(cosmo, prec)
    thermo, table = compute_tables(_tables_fn(grid, model), cosmo)
    table = table[None]
    timings["background_thermodynamics"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    k = config.output.k_grid(float(cosmo.h))
    zs = [float(z) for z in config.output.z]
    params = pt.mode_params(model, cosmo, k, grid)
    x0, y0 = pt.initial_states(model, params, prec.k_tau_ini, prec.omega_tau_ini)
    if np.any(x0 < grid.x_min):
        raise ValueError(f"precision.bg_a_min = {prec.bg_a_min:g} is above the initial scale "
                         f"factor of the largest k ({np.exp(x0.min()):.3g}); lower it")
    x_save = np.sort(-np.log1p(np.asarray(zs)))
    if np.any(x0[:, None] > x_save[None, :]):
        raise ValueError("a requested redshift lies before the perturbations start; "
                         f"max z allowed here is {np.expm1(-x0.max()):.3g}")
    weights = pt.error_weights(model)
    timings["initial_conditions"] = time.perf_counter() - t0

    # solve in chunks of equal size (one compiled program), k sorted so steps are alike
    t0 = time.perf_counter()
    order = np.argsort(k)
    one_launch = (backend == "cuda" or (backend == "auto" and pick_backend() == "cuda"))
    n_chunk = len(k) if one_launch else int(np.ceil(len(k) / N_CHUNKS))
    ys = np.empty((len(k), len(x_save), model.n))
    status = np.empty(len(k), int)
    n_acc = np.empty(len(k), int)
    n_rej = np.empty(len(k), int)
    used_backend = None
    last_info = None
    progress("perturbations", 0, len(k))
    for c in range(0, len(k), n_chunk):
        idx = order[c:c + n_chunk]
        pad = np.concatenate([idx, np.full(n_chunk - len(idx), idx[-1])])
        sol = solve(model.rhs, y0[pad], x_save, params[pad], args=table, t0=x0[pad],
                    rtol=prec.rtol, atol=prec.atol, error_weights=weights, backend=backend,
                    max_steps=200_000)
        m = len(idx)
        ys[idx] = np.asarray(sol.ys)[:m]
        status[idx] = sol.status[:m]
        n_acc[idx] = sol.n_accepted[:m]
        n_rej[idx] = sol.n_rejected[:m]
        used_backend = sol.backend
        last_info = sol.info
        progress("perturbations", min(c + n_chunk, len(k)), len(k))
    timings["perturbations"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    obs_fn = _observables_fn(model)
    obs = obs_fn(jnp.asarray(ys), jnp.asarray(x_save), jnp.asarray(params), table)
    transfers = {}
    for iz, x in enumerate(x_save):
        z = float(np.expm1(-x))
        zkey = min(zs, key=lambda zz: abs(zz - z))
        transfers[zkey] = {name: np.asarray(v[:, iz]) for name, v in obs.items()}
    timings["transfers"] = time.perf_counter() - t0

    failed = np.flatnonzero(status != 0)
    stats = {
        "backend": used_backend,
        "n_k": int(len(k)),
        "state_size": int(model.n),
        "accepted_steps_median": float(np.median(n_acc)),
        "accepted_steps_max": int(n_acc.max()),
        "rejected_steps_total": int(n_rej.sum()),
        "failed_k": [float(k[i]) for i in failed],
        "failure_reasons": [describe(status[i]) for i in failed],
        "rtol": float(prec.rtol),
        # backend details of the last chunk's solve (compile/kernel seconds, colours, LU slots...)
        "solver_info": {key: value for key, value in (last_info or {}).items()
                        if isinstance(value, (bool, int, float, str))},
    }
    resolved = cosmo.resolved()
    derived = {"z_reio": float(thermo.z_reio), "z_rec": float(thermo.z_rec),
               "z_star": float(thermo.z_star), "z_drag": float(thermo.z_drag)}
    grad_summary = grad_tables = None
    if gradients:
        from .gradients import PowerSpectrumFunction, available_parameters

        t0 = time.perf_counter()
        names = available_parameters(cosmo)
        progress("gradients", 0, 1)
        fn = PowerSpectrumFunction(config, parameters=names, k=k, z=zs)
        grad_tables = fn.dlnpk()
        progress("gradients", 1, 1)
        timings["gradients"] = time.perf_counter() - t0
        grad_summary = {
            "parameters": list(names),
            "fiducial": {n: float(v) for n, v in zip(names, grad_tables["theta"])},
            "backend": "jax (forward sensitivities)",
            "dark_energy_linearised_at_lambda": bool(fn.de_at_lambda),
            "seconds": float(timings["gradients"]),
        }
        if "dlnsigma8" in grad_tables:
            grad_summary["dlnsigma8"] = {
                f"{z:g}": {n: float(v) for n, v in zip(names, grad_tables["dlnsigma8"][iz])}
                for iz, z in enumerate(zs)}
            grad_summary["dlnsigma8_cb"] = {
                f"{z:g}": {n: float(v) for n, v in zip(names, grad_tables["dlnsigma8_cb"][iz])}
                for iz, z in enumerate(zs)}
    return PipelineResult(k=k, z=zs, transfers=transfers, cosmology=resolved,
                          backend=used_backend, solver_stats=stats, timings=timings,
                          derived=derived, gradients=grad_summary, gradient_tables=grad_tables)
