"""boltzmann-gpu: linear cosmological perturbations, P(k) and σ8, and their exact gradients.

The functions a script or notebook needs, built on the stage pipeline (docs/architecture.md)::

    import boltzmann
    config = boltzmann.load_config("lcdm")            # a name in configs/, a path or a dict
    result = boltzmann.compute(config)                # one cosmology
    result.spectra.pk_m[0, 0]                         # P_m(k) [Mpc^3] at the first redshift
    many = boltzmann.compute_many(config, cosmologies)  # one solver launch for all
    pk = boltzmann.PowerSpectrum(config, parameters=("h", "omega_cdm"))
    values, jacobian = pk.jacobian()                  # exact ∂P/∂θ by forward sensitivities

Everything computes in float64: the entry points here switch JAX to it.
"""
from __future__ import annotations

from typing import Sequence

from .ensemble import Result, StructureMismatch, run_ensemble
from .gradients import PARAMETERS
from .gradients import PowerSpectrumFunction as PowerSpectrum
from .params import Config, ConfigError, CosmoParams, load_config
from .pipeline import run
from .runtime import use_float64

__all__ = ["load_config", "compute", "compute_many", "PowerSpectrum", "PARAMETERS", "Result",
           "Config", "CosmoParams", "ConfigError", "StructureMismatch"]


def _config(config) -> Config:
    return config if isinstance(config, Config) else load_config(config)


def compute(config, *, backend="auto", gradients: bool = False) -> Result:
    """Tables, transfer functions, P(k) and σ8 of a configuration's cosmology.

    config: a ``Config``, a config name in configs/ ("lcdm"), a YAML path or a dict with the
    ``cosmology``/``output``/``precision`` blocks (docs/parameters.md). backend: "jax", "cuda",
    "auto" or a solver backend object. gradients: also ∂ln P/∂θ and ∂ln σ8/∂θ in
    ``result.gradients`` (the tables ``PowerSpectrum.dlnpk`` returns).

    Returns a ``Result`` for one cosmology: ``result.k`` (1, K) [1/Mpc],
    ``result.spectra.pk_m``/``pk_cb`` (1, Z, K) [Mpc^3], ``result.spectra.sigma8`` (1, Z),
    ``result.transfers.fields[name]`` (1, Z, K) in CLASS's normalisation, ``result.tables.derived``
    (z_reio, z_rec, z_star, z_drag). Failed modes are listed by ``result.failures()``.
    """
    use_float64()
    return run(_config(config), backend=backend, gradients=gradients)


def compute_many(config, cosmologies: Sequence[CosmoParams], *, backend="auto") -> Result:
    """The same for many cosmologies in one solver launch (they must share the species structure:
    number of massive neutrinos, Λ or fluid), with the precision and output of ``config``.

    Shapes as ``compute``'s with C = len(cosmologies) in place of 1; ``Result.ok()`` says which
    cosmologies finished. Not differentiable; use ``PowerSpectrum`` for derivatives.
    """
    use_float64()
    cfg = _config(config)
    return run_ensemble(list(cosmologies), cfg.precision, cfg.output, backend=backend)
