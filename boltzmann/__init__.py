"""boltzmann-gpu: linear cosmological perturbations, P(k) and σ8, and their exact gradients.

The functions a script or notebook needs, built on the stage pipeline (docs/architecture.md;
every name below is documented in docs/api.md)::

    import boltzmann
    config = boltzmann.load_config("lcdm")            # a name in configs/, a path or a dict
    result = boltzmann.compute(config)                # one cosmology
    result.spectra.pk_m[0, 0]                         # P_m(k) [Mpc^3] at the first redshift
    boltzmann.derived_parameters(result)              # {"100*theta_s": ..., "rs_d": ...}
    many = boltzmann.compute_many(config, cosmologies)  # one solver launch for all
    pk = boltzmann.power_spectrum(config, parameters=("h", "omega_cdm"))
    values, jac = pk.value_and_jacobian()             # exact ∂P/∂θ by forward sensitivities

CLASS users: ``from boltzmann.classy import Class`` is a classy-compatible facade.
Everything computes in float64: the entry points here switch JAX to it.
"""
from __future__ import annotations

from typing import Sequence

from . import distances
from .derived import result_derived
from .ensemble import Result, StructureMismatch, run_ensemble
from .gradients import PARAMETERS
from .gradients import PowerSpectrumFunction as PowerSpectrum
from .gradients_batch import PowerSpectrumBatch
from .params import Config, ConfigError, CosmoParams, load_config
from .pipeline import run
from .runtime import use_float64

__all__ = ["load_config", "compute", "compute_many", "power_spectrum", "PowerSpectrum",
           "PowerSpectrumBatch",
           "derived_parameters", "distances", "PARAMETERS", "Result", "Config", "CosmoParams",
           "ConfigError", "StructureMismatch"]


def _config(config) -> Config:
    return config if isinstance(config, Config) else load_config(config)


def compute(config, *, backend="auto", gradients: bool = False) -> Result:
    """Tables, transfer functions, P(k) and σ8 of a configuration's cosmology.

    config: a ``Config``, a config name in configs/ ("lcdm"), a YAML path or a dict with the
    ``cosmology``/``output``/``precision`` blocks (docs/parameters.md). backend: "jax", "cuda",
    "auto" or a solver backend object. gradients: also ∂ln P/∂θ and ∂ln σ8/∂θ in
    ``result.gradients`` (the tables ``PowerSpectrum.dlnpk`` returns).

    Returns a ``Result`` for one cosmology: ``result.k`` (1, K) [1/Mpc] (the requested grid; σ8
    integrates over the extra modes it needs), ``result.z`` (``output.z``, then the
    ``output.z_background`` redshifts not among them), ``result.spectra.pk_m``/``pk_cb``
    (1, Z, K) [Mpc^3], ``result.spectra.sigma8``/``sigma8_cb`` (1, Z),
    ``result.transfers.fields[name]`` (1, Z, K') in CLASS's normalisation on
    ``result.transfers.k`` (K' = K unless ``precision.k_solve_stride`` > 1 solves fewer),
    ``result.tables.derived`` (z_reio, z_rec, z_star, z_drag); ``derived_parameters(result)``
    gives classy's derived numbers. Failed modes are listed by ``result.failures()``.
    Not differentiable (concrete numbers); use ``power_spectrum`` for derivatives.
    """
    use_float64()
    return run(_config(config), backend=backend, gradients=gradients)


def compute_many(config, cosmologies: Sequence[CosmoParams], *, backend="auto") -> Result:
    """The same for many cosmologies in one solver launch (they must share the species structure:
    number of massive neutrinos, Λ or fluid), with the precision and output of ``config``.

    Shapes as ``compute``'s with C = len(cosmologies) in place of 1; ``Result.ok()`` says which
    cosmologies finished. Not differentiable; use ``power_spectrum`` for derivatives.
    """
    use_float64()
    cfg = _config(config)
    return run_ensemble(list(cosmologies), cfg.precision, cfg.output, backend=backend)


def power_spectrum(config, *, parameters: Sequence[str] = PARAMETERS, k=None, z=None,
                   backend: str = "jax", **options) -> PowerSpectrum:
    """The differentiable function θ ↦ {P_m, P_cb, sigma8, sigma8_cb, d_m} of a configuration.

    config: as ``compute``'s; parameters: the names θ holds, in order (default ``PARAMETERS``:
    h, omega_b, omega_cdm, ln10^{10}A_s, n_s, tau_reio, m_ncdm [eV], N_ur, w0_fld, wa_fld;
    m_ncdm only with massive neutrinos); k [1/Mpc] and z override the config's output grid;
    ``options`` go to ``PowerSpectrum`` (rtol, atol, n_chunks, with_sigma8, ...).

    The returned object ``f``: ``f.theta0`` (n_θ,) the config's values; ``f(theta)`` or
    ``f.value(theta)`` → {"P_m", "P_cb": (n_z, n_k) [Mpc^3]; "sigma8", "sigma8_cb": (n_z,);
    "d_m": (n_z, n_k)}; ``f.value_and_jacobian(theta)`` (also ``f.jacobian``) → (values, jac)
    with jac[name] of shape output + (n_θ,), exact by forward sensitivities. ``f`` is a JAX
    function of θ: ``jax.jit``, ``jax.jvp``, ``jax.jacfwd`` and ``jax.vmap`` over θ work; for
    ``jax.grad`` of a scalar of it wrap the θ-map in ``solver.grad_by_forward_mode`` (reverse
    mode through the solve costs one direction per solve input, docs/gradients.md). The k grid
    and z are fixed (not differentiated).
    """
    use_float64()
    if not isinstance(config, Config):
        config = load_config(config)
    if not isinstance(parameters, (list, tuple)):
        raise TypeError(f"parameters must be a list of names, got {type(parameters).__name__}")
    from .gradients import available_parameters

    if tuple(parameters) == PARAMETERS:
        parameters = available_parameters(config.cosmology)
    return PowerSpectrum(config, parameters=parameters, k=k, z=z, backend=backend, **options)


def derived_parameters(result: Result, names: Sequence[str] | None = None, *,
                       cosmology: int = 0) -> dict:
    """Derived numbers of a ``Result`` under classy's ``get_current_derived_parameters`` names.

    Default names: ``boltzmann.derived.SUMMARY_NAMES`` (100*theta_s, rs_d [Mpc], z_d, z_star,
    z_rec, z_reio, age [Gyr], Neff, Omega_m, Omega_Lambda or Omega_fld, sigma8 at z = 0, ...);
    ``names`` picks others (``boltzmann.derived.NAMES``). Plain floats; for derivatives use
    ``boltzmann.derived.derived_from_thermodynamics`` (JAX, differentiable in a CosmoParams).
    """
    return result_derived(result, cosmology, None if names is None else list(names))
