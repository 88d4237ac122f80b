"""The whole job for one configuration, as CLASS runs it: parameters → background and
thermodynamics → perturbations → spectra (and, on request, their parameter derivatives).

``run(config)`` is the ensemble driver (``boltzmann.ensemble.run_ensemble``) on the config's one
cosmology, so a single run and an ensemble of one are the same computation; with
``gradients=True`` it adds ∂ln P/∂θ and ∂ln σ8/∂θ from ``boltzmann.gradients``, on the same
backend, and, when the config asks for C_ℓ, their derivatives from ``boltzmann.cmb.gradients``.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from solver.backends.registry import resolve_backend

from .ensemble import Result, run_ensemble
from .progress import null_progress

__all__ = ["run", "Result", "derivative_tables", "power_spectrum_function"]


def run(config, *, backend="auto", progress=None, gradients: bool = False,
        release_compiled: bool = False) -> Result:
    """Tables, transfer functions, P(k) and σ8 for ``config`` (a ``boltzmann.params.Config``).

    backend: "jax", "cuda", "auto" or a solver backend object; progress: callback
    (stage, done, total). ``gradients=True`` also computes ∂ln P/∂θ and ∂ln σ8/∂θ for
    ``boltzmann.gradients.available_parameters`` on the same k grid and redshifts, by forward
    sensitivities on the same backend. ``release_compiled``: drop the main job's compiled
    programs from memory (``jax.clear_caches``) before the derivative programs compile, and the
    derivatives' inputs program before their solve program compiles, for a process that runs
    once (the CLI): nothing later uses them, and on the 2-core CPU the process's peak drops by
    ≈ 0.3 GB and 0.4–0.8 GiB; a caller that will run again keeps them.
    """
    progress = progress or null_progress
    derivatives, preloading = None, False
    if gradients:
        # built first, so that a later process loads the Jacobian's largest program while the
        # main job runs (PowerSpectrumFunction.preload)
        derivatives = power_spectrum_function(config, backend=backend)
        preloading = derivatives.preload()
    result = run_ensemble([config.cosmology], config.precision, config.output, backend=backend,
                          progress=progress)
    if getattr(config.output, "cl", ()):
        t0 = time.perf_counter()
        result.cl = cmb_spectra(config, result, backend=backend, progress=progress)
        result.timings["cmb"] = time.perf_counter() - t0
    if gradients:
        if release_compiled and not preloading:   # a load in progress is left alone
            jax.clear_caches()
        t0 = time.perf_counter()
        result.gradients = derivative_tables(config, result, backend=backend, progress=progress,
                                             release_inputs=release_compiled, fn=derivatives)
        result.timings["gradients"] = time.perf_counter() - t0
        if getattr(config.output, "cl", ()):
            t0 = time.perf_counter()
            result.cl_gradients = cl_derivative_table(config, backend=backend, progress=progress)
            result.timings["cmb_gradients"] = time.perf_counter() - t0
    return result


def power_spectrum_function(config, *, backend="auto", k=None, z=None):
    """The ``PowerSpectrumFunction`` whose ``dlnpk`` the job writes: all of
    ``available_parameters``, on the config's k grid and redshifts unless ``k``/``z`` say."""
    from .gradients import PowerSpectrumFunction, available_parameters

    return PowerSpectrumFunction(config, parameters=available_parameters(config.cosmology), k=k,
                                 z=z, backend=backend)


def derivative_tables(config, result: Result, *, backend="auto", progress=null_progress,
                      release_inputs: bool = False, fn=None) -> dict:
    """``PowerSpectrumFunction.dlnpk()``'s tables on the result's k grid and redshifts, with a
    JSON-able ``summary`` (parameters, fiducial θ, ∂ln σ8/∂θ, wall time); ``release_inputs``
    as ``PowerSpectrumFunction.jacobian``'s; ``fn``: the function ``power_spectrum_function``
    built for this config (used when its grid is the result's, else one is built)."""
    progress("gradients", 0, 1)
    if fn is None or not (np.array_equal(fn.k, result.k[0]) and fn.z == list(result.z)):
        fn = power_spectrum_function(config, backend=backend, k=result.k[0], z=result.z)
    names = fn.parameters
    tables = fn.dlnpk(release_inputs=release_inputs)
    progress("gradients", 1, 1)
    summary = {
        "parameters": list(names),
        "fiducial": {n: float(v) for n, v in zip(names, tables["theta"])},
        "backend": f"{fn.backend_name} (forward sensitivities)",
        "dark_energy_linearised_at_lambda": bool(fn.de_at_lambda),
        "seconds": float(tables["seconds"]),
        "stage_seconds": fn.last_stage_seconds,
    }
    if fn.last_kernel_helper is not None:   # the sensitivity kernel compiled beside the main job
        summary["kernel_helper"] = fn.last_kernel_helper
    # a CudaBackend's last tangents (its compile or cache-load seconds among them); a backend
    # given by name is the shared instance ``resolve_backend`` returns
    launch = getattr(resolve_backend(fn.backend), "last_sensitivity_info", None)
    if launch:
        summary["sensitivity_kernel"] = {k: v for k, v in launch.items() if isinstance(
            v, (bool, int, float, str, type(None)))}
    if "dlnsigma8" in tables:
        for key in ("dlnsigma8", "dlnsigma8_cb"):
            summary[key] = {f"{z:g}": {n: float(v) for n, v in zip(names, tables[key][iz])}
                            for iz, z in enumerate(result.z)}
    tables["summary"] = summary
    return tables


def cl_derivative_table(config, *, backend="auto", progress=null_progress) -> dict:
    """``boltzmann.cmb.ClFunction.dcl()`` for the config's C_ℓ request and the parameters of
    P(k)'s derivatives (``available_parameters``), with a JSON-able ``summary``."""
    from .cmb.gradients import ClFunction

    progress("cmb gradients", 0, 1)
    fn = ClFunction(config, backend=backend)
    table = fn.dcl()
    progress("cmb gradients", 1, 1)
    table["summary"] = {"parameters": list(fn.parameters), "outputs": list(table["D_ell"]),
                        "seconds": float(table["seconds"])}
    return table


def cmb_spectra(config, result: Result, *, backend="auto", progress=null_progress):
    """Stage 4: the CMB spectra of the config's output.cl (boltzmann.cmb.compute_cl) from the
    result's tables."""
    from . import modes
    from .cmb import compute_cl
    from .ensemble import stack_cosmologies

    progress("cmb", 0, 1)
    out = config.output
    model = modes.model_for(config.cosmology, config.precision)
    cl = compute_cl(result.tables, stack_cosmologies(result.cosmologies), config.precision, model,
                    l_max=out.l_max, spectra=out.cl, lensing=out.lensing, backend=backend)
    progress("cmb", 1, 1)
    return cl
