"""The conversions behind ``boltzmann.cobaya`` that do not need Cobaya: which C_ℓ a likelihood's
request makes the CMB stage compute, the C_ℓ dictionary in CLASS's layout, derived parameters
under the names Cobaya's cosmology likelihoods use, and the P(k) redshift nodes.

Kept apart from the Theory class so that they import (and are tested) without Cobaya installed.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from .cmb.stage import L_MAX_RANGE, SPECTRA
from .derived import NAMES

__all__ = ["CL_NAMES", "ClRequest", "cl_dict", "derived_value", "derived_names_known",
           "pk_redshifts", "PK_Z_MIN_SPAN"]

#: C_ℓ names in Cobaya's (CLASS's) lower-case spelling, and the CMB stage's name of each
CL_NAMES = {"tt": "TT", "te": "TE", "et": "TE", "ee": "EE", "bb": "BB", "pp": "PP"}
#: derived parameters under other names than ``boltzmann.derived``'s (classy theory's names)
_ALIASES = {"rs_drag": "rs_d", "rdrag": "rs_d"}
#: derived parameters formed from others: name → (function of the values dict)
_FORMED = {
    "Omega_b": lambda v: v["omega_b"] / v["h"] ** 2,
    "Omega_cdm": lambda v: v["omega_cdm"] / v["h"] ** 2,
    "Omega_k": lambda v: 0.0,             # flat universes only
}
#: the smallest largest redshift of the P(k) nodes: CLASS's grid of step 0.05 in ln(1+z) up to
#: it has four nodes, the fewest Cobaya's P(k, z) interpolator accepts
PK_Z_MIN_SPAN = 0.15


class ClRequest:
    """The C_ℓ likelihoods asked for: {canonical name: l_max}, lensed and unlensed."""

    def __init__(self):
        self.lensed: dict[str, int] = {}
        self.unlensed: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.lensed or self.unlensed)

    def add(self, spectra: Mapping[str, int], *, lensed: bool, log=None) -> None:
        """Add a request {"tt": l_max, ...}; ValueError (through ``log`` as Cobaya's
        LoggedError when given) for spectra or multipoles the CMB stage does not have."""
        target = self.lensed if lensed else self.unlensed
        for name, l_max in spectra.items():
            key = name.lower()
            if key not in CL_NAMES:
                _fail(log, f"C_ℓ {name!r} is not computed by boltzmann; available: "
                      + ", ".join(sorted(set(CL_NAMES) - {"et"})))
            if int(l_max) > L_MAX_RANGE[1]:
                _fail(log, f"C_ℓ to ℓ = {l_max} asked; boltzmann computes them to ℓ = "
                      f"{L_MAX_RANGE[1]}")
            canonical = CL_NAMES[key].lower()
            target[canonical] = max(target.get(canonical, 0), int(l_max))

    def wants(self, lensed: bool) -> bool:
        return bool(self.lensed if lensed else self.unlensed)

    def names(self, lensed: bool) -> list[str]:
        """The spectra of the dictionary handed out: every lensed one with pp (as CLASS's
        lensed_cl), or the unlensed ones asked for."""
        if lensed:
            return ["tt", "te", "ee", "bb", "pp"]
        return sorted(self.unlensed, key=lambda n: SPECTRA.index(CL_NAMES[n]))

    def output_block(self) -> dict:
        """The config's output keys for the CMB stage: cl, l_max (at least the stage's
        smallest), lensing."""
        wanted = {CL_NAMES[n] for n in (*self.lensed, *self.unlensed)}
        if self.lensed:                   # the lensing of T and E needs their unlensed C_ℓ and φ
            wanted |= {"TT", "EE", "TE", "PP"}
        l_max = max([*self.lensed.values(), *self.unlensed.values(), L_MAX_RANGE[0]])
        return {"cl": [s for s in SPECTRA if s in wanted], "l_max": int(l_max),
                "lensing": bool(self.lensed)}


def _fail(log, message: str):
    if log is not None:
        from cobaya.log import LoggedError
        raise LoggedError(log, message)
    raise ValueError(message)


def cl_dict(cl, names: Iterable[str], *, lensed: bool) -> dict:
    """{"ell": 0..l_max, name: (l_max + 1,)} from a ``boltzmann.cmb.ClSpectra``, in CLASS's
    layout and units: indexed by ℓ with zeros at ℓ = 0, 1; TT, TE, EE, BB dimensionless (the
    stage's μK² divided by (T_cmb 10⁶)², as CLASS's raw_cl/lensed_cl return them), pp =
    C_ℓ^φφ. ``lensed``: T and E spectra from ``cl.lensed`` (pp is the unlensed potential, as
    in CLASS's lensed_cl)."""
    ell = np.asarray(cl.ell, np.int64)
    if ell[0] != 2 or np.any(np.diff(ell) != 1):
        raise ValueError("cl_dict: the C_ℓ must be given at every ℓ from 2")
    if lensed and cl.lensed is None:
        raise ValueError("cl_dict: lensed C_ℓ asked but none were computed (output.lensing)")
    scale = 1.0 / (float(cl.T_cmb) * 1e6) ** 2
    out = {"ell": np.arange(int(ell[-1]) + 1)}
    for name in names:
        stage = CL_NAMES[name]
        source = cl.lensed if lensed and stage != "PP" else cl.cl
        if stage not in source:
            raise ValueError(f"cl_dict: {stage} was not computed")
        values = np.zeros(out["ell"].size)
        values[2:] = np.asarray(source[stage], np.float64) * (1.0 if stage == "PP" else scale)
        out[name] = values
    return out


def derived_names_known(name: str) -> bool:
    """Whether ``derived_value`` can answer ``name`` (for an error at initialisation)."""
    return name in NAMES or name in _ALIASES or name in _FORMED


def derived_value(name: str, values: Mapping[str, float]):
    """The derived parameter ``name`` (a ``boltzmann.derived`` name or an alias Cobaya's
    classy theory uses) from a ``derived.result_values``-type dict; None when it is not there."""
    name = _ALIASES.get(name, name)
    if name in _FORMED:
        return float(_FORMED[name](values))
    value = values.get(name)
    return None if value is None else float(value)


def pk_redshifts(z: Iterable[float], interpolated: bool) -> list[float]:
    """The z_pk nodes for a P(k) request at redshifts ``z``: those, and with ``interpolated``
    up to at least ``PK_Z_MIN_SPAN`` so that CLASS's ln(1+z) grid (``class_input._redshifts``)
    gives the four nodes Cobaya's interpolator needs."""
    nodes = {float(v) for v in z} | {0.0}
    if interpolated and max(nodes) < PK_Z_MIN_SPAN:
        nodes.add(PK_Z_MIN_SPAN)
    return sorted(nodes)
