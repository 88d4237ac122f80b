"""CLASS input parameters → a boltzmann configuration, for the classy facade (boltzmann.classy).

A classy script sets CLASS's names (``h``, ``omega_cdm``, ``output: mPk``, ``P_k_max_h/Mpc``,
``z_pk``, ...). ``to_config`` turns them into the dict ``boltzmann.load_config`` validates, so the
facade runs exactly the pipeline a YAML config runs. Every name is one of:

- translated (``COSMOLOGY``, ``PRECISION``, the aliases in ``_translate``: H0, Omega_b,
  Omega_cdm, ln_A_s_1e10, P_k_max_1/Mpc, tol_perturbations_integration, ...);
- accepted without effect (``NO_EFFECT``, ``NO_EFFECT_PREFIXES``): CLASS's own numerical
  settings (its approximation triggers, step sizes, tolerances of integrators this code does
  not have), file writing and verbosity, and CLASS's own C_ℓ precision settings;
- refused with ``UnsupportedOption``, which names the option and what to do instead.

Defaults are CLASS's where the physics is the same (h = 0.6781, omega_b = 0.0223828,
omega_cdm = 0.1201075, A_s = 2.100549e-9, n_s = 0.9660499, tau_reio = 0.05430842, N_ur = 3.044,
P_k_max = 1/Mpc, z_pk = 0), except YHe: CLASS's default is its BBN table, here 0.2454 (the
config default; set YHe explicitly to match a CLASS run).
"""
from __future__ import annotations

import difflib
import math
import re
from typing import Any, Mapping

import numpy as np

from .classy_cl import ClRequestError, cl_request
from .schema import COSMOLOGY_TABLE, PRECISION_TABLE

__all__ = ["CosmoError", "CosmoSevereError", "CosmoComputationError", "UnsupportedOption",
           "check_name", "to_config", "CLASS_DEFAULTS", "COSMOLOGY", "PRECISION", "NO_EFFECT",
           "NO_EFFECT_PREFIXES", "OUTPUTS", "Z_STEP_LN"]


class CosmoError(Exception):
    """Base of the facade's errors (classy's name)."""


class CosmoSevereError(CosmoError):
    """Bad or unsupported input, or a quantity that was not asked for (classy's name)."""


class CosmoComputationError(CosmoError):
    """The computation failed for this cosmology (classy's name; samplers reject the point)."""


class UnsupportedOption(CosmoSevereError, ValueError):
    """A CLASS option this code does not support; the message says what to do instead."""


#: CLASS defaults (input.c) for the cosmological inputs this code requires
CLASS_DEFAULTS = {"h": 0.67810, "omega_b": 0.02238280, "omega_cdm": 0.1201075,
                  "A_s": 2.100549e-09, "n_s": 0.9660499, "tau_reio": 0.05430842, "N_ur": 3.044}
#: cosmology names shared with the config's cosmology block
COSMOLOGY = tuple(COSMOLOGY_TABLE)
#: precision names shared with the config's precision block (l_max_* are CLASS's own names;
#: the rest are this code's, accepted as an extension)
PRECISION = tuple(PRECISION_TABLE)
#: the facade's output tokens: P(k) ones and C_ℓ ones (``boltzmann.classy_cl``: tCl, pCl, lCl);
#: the others refused
OUTPUTS = {"mPk": "pk", "mTk": "pk", "dTk": "pk", "vTk": "pk", "tCl": "cl", "pCl": "cl",
           "lCl": "cl"}
#: spacing in ln(1+z) of the redshifts solved between 0 and z_max, for P(k, z) at any z there
Z_STEP_LN = 0.05

#: names accepted and ignored: CLASS's numerical settings for its own approximations and
#: integrators (this code evolves the full hierarchies with its own tolerances: ``rtol``,
#: ``l_max_*``), its file output, verbosity, and its C_ℓ precision settings
NO_EFFECT = frozenset({
    "k_per_decade_for_bao", "k_bao_center", "k_bao_width", "perturbations_sampling_stepsize",
    "background_Nloga", "thermo_Nz_log", "thermo_Nz_lin", "evolver", "back_integration_stepsize",
    "k_min_tau0", "k_max_tau0_over_l_max", "l_logstep", "l_linstep", "l_switch_limber",
    "accurate_lensing", "num_mu_minus_lmax", "delta_l_max", "l_max_lss",
    "neglect_CMB_sources_below_visibility", "Quadrature strategy",
    "Number of momentum bins", "Maximum q", "q_linstep", "root", "headers", "format",
    "write_background", "write_thermodynamics", "write_primordial", "write_parameters",
    "write_warnings", "overwrite_root", "write_exotic_injection", "write_perturbations",
    "k_output_values", "selection", "selection_mean", "selection_width", "non_diagonal",
    "extra_metric_transfer_functions", "compute_damping_scale", "base_path",
})
NO_EFFECT_PREFIXES = ("tol_", "hyper_", "transfer_neglect_", "k_step_", "start_small_k",
                      "start_large_k", "tight_coupling_", "radiation_streaming_", "ur_fluid_",
                      "ncdm_fluid_", "reionization_sampling", "reionization_optical_depth_tol",
                      "l_max_", "recfast_", "hyrec_", "sBBN")

#: refused names and what to do instead
_ADVICE = {
    "100*theta_s": "θ_s as an input (CLASS's shooting for h) is not supported: give h or H0",
    "theta_s_100": "θ_s as an input (CLASS's shooting for h) is not supported: give h or H0",
    "z_reio": "give tau_reio (z_reio is solved for)",
    "reio_parametrization": "only CLASS's default tanh reionisation (reio_camb) is modelled: "
                            "leave reio_parametrization out or set it to reio_camb",
    "Omega_ur": "give N_ur", "omega_ur": "give N_ur",
    "N_eff": "give N_ur (massless) and N_ncdm/m_ncdm (massive); N_eff is derived",
    "Omega_ncdm": "give m_ncdm [eV]", "omega_ncdm": "give m_ncdm [eV]",
    "Omega_g": "give T_cmb", "omega_g": "give T_cmb",
    "alpha_s": "no running of the spectral index: leave alpha_s out",
    "r": "scalar modes only: no tensors", "n_t": "scalar modes only: no tensors",
    "P_k_ini type": "only the analytic power-law primordial spectrum: leave it out",
    "sigma8": "σ8 as an input (CLASS's rescaling of A_s) is not supported: give A_s or "
              "ln10^{10}A_s and read sigma8()",
    "S8": "give A_s or ln10^{10}A_s",
    "ic": "adiabatic initial conditions only: leave ic out or set it to ad",
    "modes": "scalar modes only: leave modes out or set it to s",
    "non_linear": "only the linear P(k) is computed: leave non_linear out (pk() then returns "
                  "the linear P(k), as pk_lin())",
    "recombination": "this code has its own RECFAST-type recombination (docs/thermodynamics.md; "
                     "z_rec within 0.01 of CLASS's HyRec): leave recombination out",
}
_NON_LINEAR_OFF = ("", "none", "no", "linear")
_GAUGES = ("synchronous", "sync", "newtonian", "newt")


def _known(name: str) -> bool:
    return (name in COSMOLOGY or name in PRECISION or name in _TRANSLATED or name in NO_EFFECT
            or name.endswith("_verbose") or name.startswith(NO_EFFECT_PREFIXES))


_TRANSLATED = frozenset({
    "H0", "Omega_b", "Omega_cdm", "ln_A_s_1e10", "Omega_Lambda", "Omega_fld", "Omega_k",
    "output", "P_k_max_h/Mpc", "P_k_max_1/Mpc", "P_k_min_h/Mpc", "P_k_min_1/Mpc",
    "k_per_decade_for_pk", "z_pk", "z_max_pk", "gauge", "tol_perturbations_integration",
    "non_linear", "use_ppf", "cs2_fld", "ic", "modes", "recombination", "reio_parametrization",
    "lensing", "l_max_scalars",
})


def check_name(name: str) -> None:
    """Raise ``UnsupportedOption`` unless ``name`` is a CLASS (or config) input this facade
    understands; the message names the option and what to do instead."""
    if not isinstance(name, str):
        raise UnsupportedOption(f"parameter names are strings, got {name!r}")
    if name in _ADVICE and name not in _TRANSLATED:
        raise UnsupportedOption(f"CLASS option {name!r} is not supported: {_ADVICE[name]}")
    if not _known(name):
        known = sorted(set(COSMOLOGY) | set(PRECISION) | _TRANSLATED)
        hint = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        raise UnsupportedOption(
            f"CLASS option {name!r} is not supported by boltzmann"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + "; the supported names are listed in docs/api.md (cosmology: "
            + ", ".join(sorted(set(COSMOLOGY) | {"H0", "Omega_b", "Omega_cdm"})) + ")")


def _numbers(name: str, value) -> list[float]:
    """CLASS list syntax: "0.06,0.06", a number, or a sequence → floats."""
    if isinstance(value, str):
        parts = [p for p in re.split(r"[,\s]+", value.strip()) if p]
    elif isinstance(value, (list, tuple, np.ndarray)):
        parts = list(value)
    else:
        parts = [value]
    try:
        return [float(p) for p in parts]
    except (TypeError, ValueError):
        raise CosmoSevereError(f"{name} = {value!r}: expected a number or a comma-separated "
                               f"list of numbers") from None


def _number(name: str, value) -> float:
    values = _numbers(name, value)
    if len(values) != 1:
        raise CosmoSevereError(f"{name} = {value!r}: expected one number")
    return values[0]


def _word(value) -> str:
    return str(value).strip().lower()


def _outputs(value) -> set[str]:
    tokens = {t for t in re.split(r"[,\s]+", str(value).strip()) if t}
    for t in tokens:
        if t not in OUTPUTS:
            raise UnsupportedOption(
                f"output = {value!r}: {t!r} is not computed here (available: mPk for P(k) and σ8; "
                f"mTk/vTk are accepted; tCl, pCl, lCl for the CMB C_ℓ of raw_cl/lensed_cl)")
    return tokens


def _check_choice(name: str, value, allowed) -> None:
    if _word(value) not in allowed:
        raise UnsupportedOption(f"CLASS option {name} = {value!r} is not supported: "
                                f"{_ADVICE.get(name, 'allowed: ' + ', '.join(allowed))}")


def _dark_energy(pars: Mapping, cosmo: dict) -> dict:
    """The Λ / fluid choice from Omega_Lambda, Omega_fld, use_ppf, cs2_fld; returns the closure
    checks to make once the cosmology is built ({name: value})."""
    checks = {}
    fluid = "w0_fld" in cosmo or "wa_fld" in cosmo
    for name in ("Omega_Lambda", "Omega_fld"):
        if name in pars:
            checks[name] = _number(name, pars[name])
    if "Omega_k" in pars and _number("Omega_k", pars["Omega_k"]) != 0.0:
        raise UnsupportedOption("CLASS option Omega_k != 0 is not supported: only flat "
                                "universes; leave Omega_k out")
    if fluid and checks.get("Omega_Lambda", 0.0) != 0.0:
        raise UnsupportedOption("Omega_Lambda != 0 together with w0_fld/wa_fld (Λ plus a fluid) "
                                "is not supported: set Omega_Lambda = 0 so the fluid closes the "
                                "budget")
    if not fluid and checks.get("Omega_fld", 0.0) != 0.0:
        raise UnsupportedOption("Omega_fld without w0_fld/wa_fld (a w = -1 fluid) is not "
                                "supported: leave Omega_fld out for Λ, or give w0_fld/wa_fld")
    # as CLASS, read only with a fluid (CLASS ignores them for Λ; the config refuses them there)
    if fluid and "use_ppf" in pars:
        cosmo["use_ppf"] = _yes_no("use_ppf", pars["use_ppf"])
    if fluid and "cs2_fld" in pars:
        cosmo["cs2_fld"] = _number("cs2_fld", pars["cs2_fld"])
    return checks


#: fluid settings with CLASS's names, read by _dark_energy (only when there is a fluid)
_FLUID_SETTINGS = ("use_ppf", "cs2_fld")


def _yes_no(name: str, value) -> bool:
    """CLASS's flag syntax: a word starting with y/Y (or t, 1) is true, n/N (or f, 0) false."""
    if isinstance(value, bool):
        return value
    word = _word(value)
    if word[:1] in ("y", "t", "1"):
        return True
    if word[:1] in ("n", "f", "0"):
        return False
    raise CosmoSevereError(f"{name} = {value!r}: expected yes or no")


def _redshifts(pars: Mapping) -> tuple[list[float], list[float]]:
    """(the z_pk redshifts, every redshift to solve): 0, z_pk, and a grid uniform in ln(1+z)
    (step ``Z_STEP_LN``) up to the largest of z_pk and z_max_pk, as CLASS tabulates P(k, z)
    between 0 and z_max."""
    z_pk = _numbers("z_pk", pars["z_pk"]) if "z_pk" in pars else [0.0]
    if any(z < 0 for z in z_pk):
        raise CosmoSevereError(f"z_pk = {pars['z_pk']!r}: redshifts must be >= 0")
    z_max = max(z_pk + ([_number("z_max_pk", pars["z_max_pk"])] if "z_max_pk" in pars else []))
    n = int(math.ceil(math.log1p(z_max) / Z_STEP_LN)) if z_max > 0 else 0
    grid = [float(np.expm1(i * math.log1p(z_max) / n)) for i in range(1, n)] if n else []
    return z_pk, sorted(set([0.0] + z_pk + grid + ([z_max] if z_max > 0 else [])))


def to_config(pars: Mapping[str, Any]) -> tuple[dict, dict]:
    """(config dict for ``boltzmann.load_config``, facade settings) from CLASS parameters.

    Settings: ``outputs`` (the output tokens), ``z_pk`` (the redshifts asked for),
    ``dark_energy_checks`` ({Omega_Lambda | Omega_fld: value} to compare with the flat closure
    once the cosmology exists), ``cl`` (the C_ℓ request, ``boltzmann.classy_cl.cl_request``).
    Raises ``UnsupportedOption`` / ``CosmoSevereError``.
    """
    for name in pars:
        check_name(name)
    cosmo: dict[str, Any] = {k: v for k, v in CLASS_DEFAULTS.items()}
    if "A_s" in pars or "ln10^{10}A_s" in pars or "ln_A_s_1e10" in pars:
        del cosmo["A_s"]
    for name in COSMOLOGY:
        if name in pars and name not in _FLUID_SETTINGS:
            value = pars[name]
            if name == "YHe" and isinstance(value, str) and _word(value) == "bbn":
                raise UnsupportedOption("YHe = BBN is not supported (no BBN table): give YHe "
                                        "as a number, e.g. 0.2454")
            kind = COSMOLOGY_TABLE[name].kind
            values = _numbers(name, value)
            cosmo[name] = (values if kind == "float_list" or (kind == "float_or_list"
                                                              and len(values) > 1)
                           else int(values[0]) if kind == "int" else values[0])
    if "H0" in pars:
        cosmo["h"] = _number("H0", pars["H0"]) / 100.0
    if "ln_A_s_1e10" in pars:
        cosmo["ln10^{10}A_s"] = _number("ln_A_s_1e10", pars["ln_A_s_1e10"])
    h = float(cosmo["h"])
    for name, target in (("Omega_b", "omega_b"), ("Omega_cdm", "omega_cdm")):
        if name in pars:
            cosmo[target] = _number(name, pars[name]) * h * h
    checks = _dark_energy(pars, cosmo)

    outputs = _outputs(pars.get("output", ""))
    for name in ("non_linear",):
        if name in pars:
            _check_choice(name, pars[name], _NON_LINEAR_OFF)
    for name, allowed in (("gauge", _GAUGES), ("ic", ("ad",)), ("modes", ("s",)),
                          ("recombination", ("recfast",)),
                          ("reio_parametrization", ("reio_camb",))):
        if name in pars:
            _check_choice(name, pars[name], allowed)

    output: dict[str, Any] = {}
    z_pk, output["z"] = _redshifts(pars)
    k_max = 1.0 / h                                  # CLASS's default P_k_max_1/Mpc = 1
    if "P_k_max_h/Mpc" in pars:
        k_max = _number("P_k_max_h/Mpc", pars["P_k_max_h/Mpc"])
    if "P_k_max_1/Mpc" in pars:
        k_max = _number("P_k_max_1/Mpc", pars["P_k_max_1/Mpc"]) / h
    output["k_max"] = k_max
    if "P_k_min_h/Mpc" in pars:
        output["k_min"] = _number("P_k_min_h/Mpc", pars["P_k_min_h/Mpc"])
    if "P_k_min_1/Mpc" in pars:
        output["k_min"] = _number("P_k_min_1/Mpc", pars["P_k_min_1/Mpc"]) / h
    if "k_per_decade_for_pk" in pars:
        output["k_per_decade"] = _number("k_per_decade_for_pk", pars["k_per_decade_for_pk"])

    try:
        cl_keys, cl_settings = cl_request(pars, outputs)
    except ClRequestError as exc:
        raise CosmoSevereError(str(exc)) from None
    output.update(cl_keys)
    precision = {name: pars[name] for name in PRECISION if name in pars}
    if "tol_perturbations_integration" in pars:
        precision["rtol"] = _number("tol_perturbations_integration",
                                    pars["tol_perturbations_integration"])
    for name, value in precision.items():
        precision[name] = (int(_number(name, value)) if PRECISION_TABLE[name].kind == "int"
                           else _number(name, value))
    config = {"name": "classy", "cosmology": cosmo, "output": output, "precision": precision}
    return config, {"outputs": outputs, "z_pk": z_pk, "dark_energy_checks": checks,
                    "cl": cl_settings}
