"""Sampling convergence of the CMB stage: the spectra of the default ``ClSampling`` against
refined samplings (scripts/cl_convergence.py prints the table, tests/test_cmb_convergence.py
checks it, docs/cmb.md records it).

A sampling is converged when refining it changes the spectra by much less than the accuracy
asked of them: what a refinement changes is (to leading order) the sampling error left in the
coarser run. The refinements are ``ClSampling.refined``: every k step halved (``k``), every τ step
halved (``tau``), twice the sampled multipoles (``ell``), or all three at once (``all``).
``whole_k`` is not a refinement of a step: every multipole over the whole transfer k grid (no
``transfer_window``) and Δ^φ on every wavenumber, which measures what the windows leave out.
"""
from __future__ import annotations

import math
import time
from dataclasses import fields, replace

import numpy as np

from .sampling import ClSampling

__all__ = ["VARIANTS", "RANGES", "refined_sampling", "with_settings", "convergence_table",
           "max_changes"]

#: refinement factors (k, τ, ℓ) of each variant
VARIANTS = {"all": (2.0, 2.0, 2.0), "k": (2.0, 1.0, 1.0), "tau": (1.0, 2.0, 1.0),
            "ell": (1.0, 1.0, 2.0), "whole_k": None}
#: ℓ ranges of the accuracy table (docs/cmb.md); PP's target starts at ℓ = 10
RANGES = ((2, 29), (30, 500), (501, 1500), (1501, 2000), (2001, 2500))


def with_settings(base: ClSampling, text: str) -> ClSampling:
    """``base`` with the fields that ``text`` sets, "name=value" joined by "+" (e.g.
    "tau_step_max=6.25+k_spline_degree=3"); a value of "none" is None. Why: the single-knob
    comparisons behind the defaults (docs/cmb.md, Sampling) are runs of this script too."""
    names = [f.name for f in fields(ClSampling)]
    changes = {}
    for item in text.split("+"):
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in names or not value:
            raise ValueError(f"{item!r}: give name=value with a ClSampling field name "
                             f"({', '.join(names)})")
        current = getattr(base, name)
        if value.strip().lower() == "none":
            changes[name] = None
        elif isinstance(current, int) and not isinstance(current, bool):
            changes[name] = int(value)
        else:
            changes[name] = float(value)
    return replace(base, **changes)


def refined_sampling(variant: str, base: ClSampling = ClSampling()) -> ClSampling:
    """``base`` refined as ``VARIANTS[variant]`` says ("default" is ``base`` itself), or, for a
    variant "name=value[+name=value]", ``base`` with those fields set (``with_settings``)."""
    if variant == "default":
        return base
    if "=" in variant:
        return with_settings(base, variant)
    if variant not in VARIANTS:
        raise ValueError(f"unknown refinement {variant!r}; choose from {', '.join(VARIANTS)}")
    if VARIANTS[variant] is None:
        return replace(base, k_window_extra=None, phi_k_stride=1)
    k, tau, ell = VARIANTS[variant]
    return base.refined(k=k, tau=tau, ell=ell)


def convergence_table(config, variants, *, l_max=None, lensing: bool = False, backend="jax",
                      base: ClSampling = ClSampling(), log=lambda s: None) -> dict:
    """{"default" | variant: ClSpectra} of ``config``'s cosmology: the tables once, then
    ``compute_cl`` per sampling (TT, EE, TE, PP, and the lensed spectra with ``lensing``)."""
    from .stage import compute_cl, config_tables

    l_max = int(config.output.l_max if l_max is None else l_max)
    stacked, model, _, tables = config_tables(config)
    runs = {}
    for variant in ["default", *[v for v in variants if v != "default"]]:
        t0 = time.perf_counter()
        runs[variant] = compute_cl(tables, stacked, config.precision, model, l_max=l_max,
                                   spectra=("TT", "EE", "TE", "PP"), lensing=lensing,
                                   sampling=refined_sampling(variant, base), backend=backend)
        info = runs[variant].info
        log(f"{variant}: {time.perf_counter() - t0:.0f} s, {info['k_source']} modes, "
            f"{info['tau_samples']} times, {info['k_transfer']} transfer k, "
            f"{info['ell_sampled']} multipoles, {info['solver_failures']} failures")
    return runs


def _relative(ref, other, lensed: bool) -> dict:
    """{spectrum: |other/ref - 1| per ℓ} (TE: |ΔD^TE|/√(D^TT D^EE)); lensed ones as "TT_lensed"."""
    a, b = ref.d_ell(lensed=lensed), other.d_ell(lensed=lensed)
    suffix = "_lensed" if lensed else ""
    out = {}
    for name in a:
        if name == "TE":
            out[name + suffix] = np.abs(b["TE"] - a["TE"]) / np.sqrt(a["TT"] * a["EE"])
        elif name != "BB" or lensed:
            out[name + suffix] = np.abs(b[name] / a[name] - 1.0)
    return out


def max_changes(ref, other, ranges=RANGES) -> dict:
    """{spectrum: [max change in each of ``ranges``]} between two ClSpectra on the same ℓ
    (NaN where a range lies outside the spectra, or below ℓ = 10 for PP)."""
    ell = np.asarray(ref.ell)
    if not np.array_equal(ell, np.asarray(other.ell)):
        raise ValueError("max_changes: the two spectra have different multipoles")
    rel = _relative(ref, other, False)
    if ref.lensed is not None and other.lensed is not None:
        rel.update(_relative(ref, other, True))
    table = {}
    for name, values in rel.items():
        row = []
        for lo, hi in ranges:
            lo = max(lo, 10) if name == "PP" else lo
            sel = (ell >= lo) & (ell <= hi)
            row.append(float(np.max(values[sel])) if sel.any() else math.nan)
        table[name] = row
    return table
