"""The differentiated parameters θ of a config: their names, the fiducial θ0, and θ → CosmoParams.

One map for every derivative the package takes (P(k) in ``boltzmann.gradients``, C_ℓ in
``boltzmann.cmb.gradients``), so that "∂/∂m_ncdm" or "∂/∂w0_fld at Λ" means the same thing in
each.  Names are the config's, plus ``ln10^{10}A_s`` (A_s = e^θ 1e-10), ``m_ncdm`` (every massive
species moved by the same amount), ``m_ncdm[i]`` (one species), and YHe, T_cmb, k_pivot.

Dark energy at the Λ point: the c_s² = 1 fluid is singular at w = −1, so asking for w0_fld or
wa_fld in a Λ config moves the background to the w0–wa fluid at (−1, 0) — the same expansion —
and sets ``de_at_lambda``, which selects the perturbations linearised about Λ
(``modes.model_for(..., de_at_lambda=True)``; docs/gradients.md).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .params import ConfigError, CosmoParams

__all__ = ["PARAMETERS", "PRIMORDIAL_FIELDS", "ParameterMap", "parse_name",
           "available_parameters", "one", "jvps_along", "widen"]

#: the issue's parameter list, in this order (config names)
PARAMETERS = ("h", "omega_b", "omega_cdm", "ln10^{10}A_s", "n_s", "tau_reio", "m_ncdm", "N_ur",
              "w0_fld", "wa_fld")

#: cosmology fields that enter only the primordial spectrum P_R(k) = A_s (k/k_pivot)^(n_s - 1):
#: the perturbations are solved at unit primordial curvature, so the tables, the modes' rows and
#: their initial states do not depend on them
PRIMORDIAL_FIELDS = ("A_s", "n_s", "k_pivot")

_SCALARS = ("h", "omega_b", "omega_cdm", "A_s", "n_s", "tau_reio", "N_ur", "w0_fld", "wa_fld",
            "YHe", "T_cmb", "k_pivot")


def available_parameters(cosmo) -> tuple:
    """The PARAMETERS a cosmology can be differentiated in (m_ncdm only with massive species)."""
    return tuple(p for p in PARAMETERS if p != "m_ncdm" or cosmo.n_ncdm > 0)


def parse_name(name: str):
    """('scalar', leaf) | ('ln10As', None) | ('m_all', None) | ('m_one', i)."""
    if name == "ln10^{10}A_s":
        return "ln10As", None
    if name == "m_ncdm":
        return "m_all", None
    if name.startswith("m_ncdm[") and name.endswith("]"):
        try:
            return "m_one", int(name[7:-1])
        except ValueError:
            pass
    if name in _SCALARS:
        return "scalar", name
    raise ConfigError(f"gradients: unknown parameter {name!r}; allowed: {', '.join(PARAMETERS)}, "
                      "A_s, m_ncdm[i], YHe, T_cmb")


class ParameterMap:
    """θ ↔ cosmology for ``parameters`` of the config cosmology ``cosmo``.

    ``names``: the parameters, in θ's order; ``theta0``: their fiducial values; ``cosmo0``: the
    fiducial cosmology (with the fluid at (−1, 0) when ``de_at_lambda``); ``cosmology(θ)``: the
    CosmoParams at θ (traceable)."""

    def __init__(self, cosmo, parameters: Sequence[str] = PARAMETERS):
        self.names = tuple(parameters)
        if len(set(self.names)) != len(self.names):
            raise ConfigError(f"gradients: repeated parameter names in {self.names}")
        parsed = [parse_name(p) for p in self.names]
        if any(p[0] in ("m_all", "m_one") for p in parsed) and cosmo.n_ncdm == 0:
            raise ConfigError("gradients: m_ncdm requested but the cosmology has no massive "
                              "neutrino species (set cosmology.m_ncdm, or drop m_ncdm from the "
                              "parameter list)")
        for kind, i in parsed:
            if kind == "m_one" and not 0 <= i < cosmo.n_ncdm:
                raise ConfigError(f"gradients: m_ncdm[{i}] out of range; the cosmology has "
                                  f"{cosmo.n_ncdm} massive species")
        self.de_at_lambda = (any(p[1] in ("w0_fld", "wa_fld") for p in parsed)
                             and not cosmo.use_fld)
        if self.de_at_lambda:
            cosmo = dataclasses.replace(cosmo, w0_fld=-1.0, wa_fld=0.0, use_fld=True)
        self.cosmo0 = cosmo
        self.parsed = parsed
        self.theta0 = jnp.asarray([self._fiducial(kind, leaf) for kind, leaf in parsed],
                                  jnp.float64)

    @property
    def solve_directions(self) -> np.ndarray:
        """Indices (into θ) of the parameters the perturbation solve's inputs depend on: all but
        the primordial ones (``PRIMORDIAL_FIELDS``, ``ln10^{10}A_s``), whose tangents of the
        tables, rows and initial states are exactly zero -- a sensitivity solve along them
        would integrate zeros at the cost of any other direction. At least one index (the
        first parameter) when every parameter is primordial: the joint solve gives the values."""
        keep = [j for j, (kind, leaf) in enumerate(self.parsed)
                if not (kind == "ln10As" or (kind == "scalar" and leaf in PRIMORDIAL_FIELDS))]
        return np.asarray(keep or [0], np.int64)

    def _fiducial(self, kind, leaf) -> float:
        c = self.cosmo0
        if kind == "ln10As":
            return float(c.ln10_10_A_s)
        if kind == "m_all":
            return float(np.mean(np.asarray(c.m_ncdm)))
        if kind == "m_one":
            return float(np.asarray(c.m_ncdm)[leaf])
        return float(getattr(c, leaf))

    def cosmology(self, theta) -> CosmoParams:
        """The CosmoParams at θ (leaves may be tracers)."""
        c = self.cosmo0
        theta = jnp.asarray(theta)
        updates = {}
        m = jnp.asarray(c.m_ncdm, jnp.float64)
        for j, (kind, leaf) in enumerate(self.parsed):
            if kind == "ln10As":
                updates["A_s"] = 1e-10 * jnp.exp(theta[j])
            elif kind == "m_all":
                m = m + (theta[j] - float(np.mean(np.asarray(c.m_ncdm))))
            elif kind == "m_one":
                m = m.at[leaf].add(theta[j] - float(np.asarray(c.m_ncdm)[leaf]))
            else:
                updates[leaf] = theta[j]
        if any(kind in ("m_all", "m_one") for kind, _ in self.parsed):
            updates["m_ncdm"] = m
        return dataclasses.replace(c, **updates)


def jvps_along(f, theta, directions):
    """(f(θ), tangents of f along the unit vectors of θ's ``directions`` with that axis first):
    ``jax.jacfwd(f)(θ)``'s columns ``directions`` (moved to the front), the primal computed once."""
    basis = jnp.eye(theta.size, dtype=theta.dtype)[np.asarray(directions)]
    return jax.vmap(lambda e: jax.jvp(f, (theta,), (e,)), out_axes=(None, 0))(basis)


def widen(tangents, directions, m: int):
    """Tangents along ``directions`` (that axis first, on every leaf) as tangents along all m
    parameters, zero along the others."""
    idx = np.asarray(directions)
    return jax.tree_util.tree_map(
        lambda t: jnp.zeros((m,) + t.shape[1:], t.dtype).at[idx].set(t), tangents)


def one(cosmo: CosmoParams) -> CosmoParams:
    """``cosmo`` as an ensemble of one (a leading axis of 1 on every leaf); traceable."""
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64)[None], cosmo)
