"""Derived parameters under classy's names, and the background observables table.

CLASS users read derived numbers through ``get_current_derived_parameters([...])`` and
likelihoods read H(z), D_A(z), f σ8(z); this module forms both from what the pipeline already
has — the cosmology (``boltzmann.distances``), the thermodynamic redshifts of the tables stage
(z_rec, z_star, z_drag, z_reio) and σ8 from the spectra stage — with CLASS's definitions:

- ``100*theta_s`` (= ``theta_s_100``) = 100 r_s(z_rec)/D_M(z_rec), z_rec the maximum of the
  visibility function; ``100*theta_star`` the same at z_star (photon optical depth 1);
- ``rs_d`` = r_s(z_d), z_d where the baryon drag depth crosses 1; ``rs_rec``, ``rs_star``,
  ``ra_*`` (comoving distance) and ``da_*`` (angular distance) at those redshifts, in Mpc;
- ``age`` [Gyr], ``conformal_age`` [Mpc], ``Neff``, ``Omega_m`` (b + cdm + ncdm), ``omega_m``,
  ``Omega_Lambda`` / ``Omega0_lambda``, ``Omega_fld`` / ``Omega0_fld``, ``h``, ``H0`` [km/s/Mpc],
  the primordial and thermal inputs, ``sigma8``/``sigma8_cb`` (at z = 0).

``derived_parameters`` is plain JAX in the cosmology and the redshifts (differentiable);
``derived_from_thermodynamics`` also computes the redshifts from the cosmology (traceable
end to end); ``result_derived`` reads a ``Result``. ``background_table`` gives background.csv's
columns (``boltzmann.output.BACKGROUND_COLUMNS``).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from solver.persisted import PersistedProgram

from . import distances as dist

__all__ = ["SUMMARY_NAMES", "NAMES", "UnknownDerivedParameter", "derived_parameters",
           "derived_from_thermodynamics", "result_values", "result_derived", "pick",
           "background_table", "sigma8_at"]

#: the derived numbers summary.json lists (classy's names); Omega_Lambda or Omega_fld by model
SUMMARY_NAMES = ("100*theta_s", "100*theta_star", "rs_d", "rs_rec", "rs_star", "z_d", "z_rec",
                 "z_star", "z_reio", "tau_reio", "age", "conformal_age", "Neff", "h", "H0",
                 "Omega_m", "omega_m", "Omega_Lambda", "Omega_fld", "sigma8", "sigma8_cb")

#: names read from the thermodynamics stage (``tables.DERIVED`` under its own names)
_THERMO = {"z_rec": "z_rec", "z_star": "z_star", "z_d": "z_drag", "z_reio": "z_reio"}


class UnknownDerivedParameter(KeyError):
    """A name ``get_current_derived_parameters`` does not know (the message lists the names)."""

    def __str__(self):  # KeyError would print the message in quotes
        return str(self.args[0])


def _at_redshift(cosmo, z) -> dict:
    """r_s, comoving and angular distance at one redshift [Mpc]."""
    chi = dist.comoving_distance(cosmo, z)
    return {"rs": dist.sound_horizon(cosmo, z), "ra": chi, "da": chi / (1.0 + z),
            "tau": dist.conformal_age(cosmo) - chi}


def derived_parameters(cosmo, thermo: Mapping, sigma8=None, sigma8_cb=None) -> dict:
    """Every derived number this code computes, under classy's names (JAX scalars).

    cosmo: one ``CosmoParams``; thermo: {"z_rec", "z_star", "z_drag", "z_reio"} (the tables
    stage's ``derived``, concrete or traced; the entries that are missing are left out, with the
    numbers that need them); sigma8, sigma8_cb: σ8 at z = 0 when known. Differentiable in every
    CosmoParams leaf and in the redshifts.
    """
    out = {
        "h": cosmo.h, "H0": 100.0 * cosmo.h, "omega_b": cosmo.omega_b,
        "omega_cdm": cosmo.omega_cdm, "Omega_m": cosmo.Omega_m, "omega_m": cosmo.omega_m,
        "Omega_Lambda": cosmo.Omega_Lambda, "Omega0_lambda": cosmo.Omega_Lambda,
        "Omega_fld": cosmo.Omega_fld, "Omega0_fld": cosmo.Omega_fld,
        "Omega_r": cosmo.omega_r / cosmo.h**2, "Omega_nu": cosmo.omega_ncdm_tot / cosmo.h**2,
        "Neff": cosmo.N_eff, "age": dist.age_gyr(cosmo), "conformal_age": dist.conformal_age(cosmo),
        "A_s": cosmo.A_s, "ln10^{10}A_s": cosmo.ln10_10_A_s, "ln_A_s_1e10": cosmo.ln10_10_A_s,
        "n_s": cosmo.n_s, "tau_reio": cosmo.tau_reio, "YHe": cosmo.YHe, "T_cmb": cosmo.T_cmb,
        "exp_m_2_tau_As": jnp.exp(-2.0 * cosmo.tau_reio) * cosmo.A_s,
    }
    if cosmo.n_ncdm:
        out["m_ncdm_in_eV"] = jnp.asarray(cosmo.m_ncdm)[0]
        out["m_ncdm_tot"] = jnp.sum(jnp.asarray(cosmo.m_ncdm))
    for name, key in _THERMO.items():
        if key in thermo:
            out[name] = jnp.asarray(thermo[key], jnp.float64)
    for tag, zname in (("rec", "z_rec"), ("star", "z_star"), ("d", "z_d")):
        if zname not in out:
            continue
        at = _at_redshift(cosmo, out[zname])
        out.update({f"rs_{tag}": at["rs"], f"ra_{tag}": at["ra"], f"da_{tag}": at["da"],
                    f"tau_{tag}": at["tau"], f"rs_{tag}_h": at["rs"] * cosmo.h})
    if "rs_rec" in out:
        out["100*theta_s"] = out["theta_s_100"] = 100.0 * out["rs_rec"] / out["ra_rec"]
    if "rs_star" in out:
        out["100*theta_star"] = out["theta_star_100"] = 100.0 * out["rs_star"] / out["ra_star"]
    if sigma8 is not None:
        out["sigma8"] = jnp.asarray(sigma8, jnp.float64)
        out["S8"] = out["sigma8"] * jnp.sqrt(out["Omega_m"] / 0.3)
    if sigma8_cb is not None:
        out["sigma8_cb"] = jnp.asarray(sigma8_cb, jnp.float64)
    return out


#: every name ``derived_parameters`` can return (for error messages and docs)
NAMES = ("h", "H0", "omega_b", "omega_cdm", "Omega_m", "omega_m", "Omega_Lambda",
         "Omega0_lambda", "Omega_fld", "Omega0_fld", "Omega_r", "Omega_nu", "Neff", "age",
         "conformal_age", "A_s", "ln10^{10}A_s", "ln_A_s_1e10", "n_s", "tau_reio", "YHe", "T_cmb",
         "exp_m_2_tau_As", "m_ncdm_in_eV", "m_ncdm_tot", "z_rec", "z_star", "z_d", "z_reio",
         *(f"{q}_{t}" for t in ("rec", "star", "d") for q in ("rs", "ra", "da", "tau")),
         "rs_rec_h", "rs_star_h", "rs_d_h", "100*theta_s", "theta_s_100", "100*theta_star",
         "theta_star_100", "sigma8", "S8", "sigma8_cb")


def derived_from_thermodynamics(cosmo, grid, sigma8=None, sigma8_cb=None) -> dict:
    """``derived_parameters`` with the thermodynamic redshifts computed from ``cosmo`` on the
    tables' ln a ``grid`` (``boltzmann.modes.make_grid``): traceable end to end, for jax.grad
    of θ_s, r_d, ... with respect to the parameters."""
    from .tables import thermodynamics_on

    th = thermodynamics_on(cosmo, grid)
    return derived_parameters(cosmo, {"z_rec": th.z_rec, "z_star": th.z_star,
                                      "z_drag": th.z_drag, "z_reio": th.z_reio},
                              sigma8, sigma8_cb)


def sigma8_at(result, z: float, c: int = 0, *, name: str = "sigma8"):
    """σ8 (``name`` = "sigma8") or σ8_cb ("sigma8_cb") of cosmology c at redshift z of a
    ``Result``; None when z was not solved or σ8 could not be formed there."""
    zs = [float(v) for v in result.z]
    if float(z) not in zs:
        return None
    iz = zs.index(float(z))
    problem = result.spectra.problem(c, "d_m" if name == "sigma8" else "d_cb", result.z[iz])
    value = float(getattr(result.spectra, name)[c, iz])
    return None if problem is not None or not math.isfinite(value) else value


#: persisted (solver.persisted): a later process loads its traced form instead of tracing the
#: background quadratures it contains again
_derived_program = PersistedProgram(derived_parameters, ("boltzmann.derived",),
                                    name="boltzmann.derived")


def result_values(result, c: int = 0) -> dict:
    """Every derived number (plain floats) cosmology c of a ``Result`` has: the thermodynamic
    redshifts of its tables, σ8 at z = 0 when z = 0 was solved."""
    cosmo = result.cosmologies[c]
    thermo = {k: float(np.asarray(v)[c]) for k, v in result.tables.derived.items()}
    s8, s8_cb = sigma8_at(result, 0.0, c), sigma8_at(result, 0.0, c, name="sigma8_cb")
    return {k: float(v) for k, v in _derived_program(cosmo, thermo, s8, s8_cb).items()}


def pick(values: Mapping, names: Sequence[str] | None, use_fld: bool) -> dict:
    """``names`` out of ``values`` (default ``SUMMARY_NAMES`` minus those the model or run lacks:
    Omega_fld for Λ, Omega_Lambda for a fluid, sigma8 when z = 0 was not solved). An unknown
    name raises ``UnknownDerivedParameter`` listing the known ones; a known one the run cannot
    give (σ8 without z = 0) raises ``KeyError`` saying what to add."""
    if names is None:
        drop = {"Omega_Lambda"} if use_fld else {"Omega_fld"}
        return {n: values[n] for n in SUMMARY_NAMES if n in values and n not in drop}
    out = {}
    for n in names:
        if n not in NAMES:
            raise UnknownDerivedParameter(
                f"unknown derived parameter {n!r}; this code computes: {', '.join(NAMES)}")
        if n not in values:
            why = ("σ8 is at z = 0: add 0 to the redshifts (output.z or output.z_background; "
                   "z_pk in classy)" if n.startswith(("sigma8", "S8")) else
                   "this cosmology has no massive neutrinos" if "ncdm" in n else
                   "the thermodynamics stage did not provide it")
            raise KeyError(f"derived parameter {n!r} is not available for this run: {why}")
        out[n] = values[n]
    return out


def result_derived(result, c: int = 0, names: Sequence[str] | None = None) -> dict:
    """Derived numbers (plain floats) of cosmology c of a ``Result``, under classy's names
    (``pick`` says which and how a missing one is reported)."""
    return pick(result_values(result, c), names, result.cosmologies[c].use_fld)


@jax.jit
def _background_columns(cosmo, z):
    D, f = dist.growth(cosmo, z)
    return {"H_1/Mpc": dist.hubble(cosmo, z), "D_A_Mpc": dist.angular_distance(cosmo, z),
            "D_M_Mpc": dist.transverse_comoving_distance(cosmo, z),
            "D_H_Mpc": dist.hubble_distance(cosmo, z), "D_V_Mpc": dist.volume_distance(cosmo, z),
            "D_L_Mpc": dist.luminosity_distance(cosmo, z), "D": D, "f": f}


def background_table(cosmo, z, sigma8=None, sigma8_cb=None) -> dict:
    """{column: (n_z,) numpy} of background.csv for redshifts z (``BACKGROUND_COLUMNS`` order
    is the writer's business): H [1/Mpc], D_A, D_M, D_H, D_V, D_L [Mpc], growth D and f, and,
    given σ8(z) (n_z,) (NaN where unknown), sigma8, fsigma8 and sigma8_cb."""
    z = np.asarray(z, np.float64)
    cols = {"z": z, **{k: np.asarray(v) for k, v in _background_columns(cosmo, z).items()}}
    nan = np.full(z.shape, np.nan)
    s8 = nan if sigma8 is None else np.asarray(sigma8, np.float64)
    cols["sigma8"] = s8
    cols["fsigma8"] = cols["f"] * s8
    cols["sigma8_cb"] = nan if sigma8_cb is None else np.asarray(sigma8_cb, np.float64)
    return cols
