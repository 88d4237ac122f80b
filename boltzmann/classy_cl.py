"""C_ℓ in the classy facade: CLASS's C_ℓ inputs → config keys, and spectra → classy's dicts.

CLASS asks for CMB spectra with ``output`` tokens — ``tCl`` (temperature), ``pCl`` (E and B
polarisation), ``lCl`` (the lensing potential) — with ``lensing = yes/no`` and
``l_max_scalars``. ``cl_request`` turns them into the config's ``output.cl``, ``output.lensing``
and ``output.l_max``, spectrum by spectrum as CLASS decides which ones exist:

=========================  ===========================================
CLASS                       config
=========================  ===========================================
tCl                         TT
pCl                         EE (and BB with lensing: scalar B is lensed E)
tCl and pCl                 TE
lCl                         PP
lensing = yes               lensing: true (CLASS's rule: needs lCl and tCl or pCl)
l_max_scalars (2500)        l_max (at least 30, the stage's smallest)
=========================  ===========================================

``cl_dict`` gives what classy's ``raw_cl``/``lensed_cl`` return: {"ell": 0..lmax, "tt", "ee",
"te", "bb", "pp"}, arrays indexed by ℓ from 0 with zeros at ℓ < 2, dimensionless — (ΔT/T)² for
TT, EE, TE, BB (the stage's μK² divided by (10⁶ T_cmb)²) and C_ℓ^φφ — with the keys of the
requested tokens only (tCl: tt; pCl: ee, bb; both: te; lCl: pp), as classy. ``raw_cl``'s bb is 0
(scalar modes make no unlensed B); ``lensed_cl``'s pp is the unlensed C_ℓ^φφ (CLASS's too).
CLASS's cross-spectra with the potential (tp, and ep where CLASS has it) are not computed here
and left out of the dicts.
"""
from __future__ import annotations

import numpy as np

from .schema import OUTPUT_TABLE

__all__ = ["CL_TOKENS", "L_MAX_SCALARS_DEFAULT", "ClRequestError", "cl_request", "cl_dict",
           "yes_no"]

#: CLASS's output tokens of CMB spectra
CL_TOKENS = ("tCl", "pCl", "lCl")
#: CLASS's default l_max_scalars
L_MAX_SCALARS_DEFAULT = 2500
#: the CMB stage's supported l_max (output.l_max)
_L_MAX = OUTPUT_TABLE["l_max"].allowed


class ClRequestError(ValueError):
    """A C_ℓ request CLASS would refuse; ``class_input.to_config`` re-raises it as classy's
    ``CosmoSevereError`` (this module does not import class_input, which imports it)."""


def yes_no(name: str, value) -> bool:
    """CLASS's flag syntax: True/False, or a word starting with y/n (also true/false, 1/0)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    word = str(value).strip().lower()
    if word[:1] in ("y", "t", "1"):
        return True
    if word[:1] in ("n", "f", "0"):
        return False
    raise ClRequestError(f"{name} = {value!r}: expected yes or no")


def cl_request(pars, outputs) -> tuple[dict, dict]:
    """(config ``output`` keys, facade settings) for CLASS's C_ℓ inputs in ``pars``.

    ``outputs``: the set of output tokens. Without C_ℓ tokens the keys are empty (and
    ``lensing = yes`` is CLASS's error). Settings: ``tokens`` (the C_ℓ tokens), ``lensing``,
    ``l_max`` (``l_max_scalars``: what ``raw_cl``/``lensed_cl`` return by default and at most).
    """
    tokens = {t for t in outputs if t in CL_TOKENS}
    lensing = yes_no("lensing", pars["lensing"]) if "lensing" in pars else False
    if lensing and not ("lCl" in tokens and tokens & {"tCl", "pCl"}):
        raise ClRequestError(
            "you asked for lensed CMB Cls, but this requires 'output' to include 'tCl' and/or "
            f"'pCl', and also, importantly, 'lCl' (output = {pars.get('output', '')!r}): add "
            "them, e.g. output = 'tCl,pCl,lCl', or set lensing = no")
    l_max = L_MAX_SCALARS_DEFAULT
    if "l_max_scalars" in pars:
        value = pars["l_max_scalars"]
        try:
            l_max = int(float(value))
        except (TypeError, ValueError):
            raise ClRequestError(f"l_max_scalars = {value!r}: expected an integer") from None
        if l_max < 2 or l_max > _L_MAX.hi:
            raise ClRequestError(
                f"l_max_scalars = {value!r}: the CMB spectra are computed for 2 <= l_max_scalars "
                f"<= {_L_MAX.hi:g}; choose a value in that range")
    settings = {"tokens": tokens, "lensing": lensing, "l_max": l_max}
    if not tokens:
        return {}, settings
    cl = (["TT"] if "tCl" in tokens else []) + (["EE"] if "pCl" in tokens else []) \
        + (["TE"] if {"tCl", "pCl"} <= tokens else []) \
        + (["BB"] if "pCl" in tokens and lensing else []) + (["PP"] if "lCl" in tokens else [])
    # the stage computes from ℓ = 30 up; a smaller l_max_scalars is served from that run
    return {"cl": cl, "lensing": lensing, "l_max": max(l_max, int(_L_MAX.lo))}, settings


def cl_dict(spectra, settings: dict, lmax: int, *, lensed: bool) -> dict:
    """classy's dict (module docstring) of ``spectra`` (a boltzmann.cmb.ClSpectra) for
    ℓ = 0..lmax; ``lmax`` must not exceed ``spectra.ell[-1]`` (the caller checks)."""
    tokens = settings["tokens"]
    names = (["tt"] if "tCl" in tokens else []) + (["ee"] if "pCl" in tokens else []) \
        + (["te"] if {"tCl", "pCl"} <= tokens else []) + (["bb"] if "pCl" in tokens else []) \
        + (["pp"] if "lCl" in tokens else [])
    ell = np.asarray(spectra.ell)
    n = int(lmax) + 1
    keep = ell < n
    to_dimensionless = 1.0 / (1e6 * float(spectra.T_cmb)) ** 2
    out = {}
    for name in names:
        column = np.zeros(n)
        if name == "pp":
            source = spectra.cl["PP"]
            factor = 1.0
        elif lensed:
            source = spectra.lensed[name.upper()]
            factor = to_dimensionless
        else:
            source = spectra.cl.get(name.upper())
            factor = to_dimensionless
        if source is not None:      # unlensed BB: not in spectra.cl (scalar modes make no B)
            column[ell[keep]] = np.asarray(source, np.float64)[keep] * factor
        out[name] = column
    out["ell"] = np.arange(n)
    return out
