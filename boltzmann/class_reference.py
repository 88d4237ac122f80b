"""CLASS as the reference of ``transfer --compare``: the run's parameters in CLASS's names, CLASS
run through classy, its P(k) and C_ℓ in this code's layouts.

``class_parameters(config)`` is the inverse of ``boltzmann.class_input.to_config`` for what a
config holds: ``to_config(class_parameters(config))`` loads to the same cosmology, redshifts and
C_ℓ request (tested), so the CLASS run and ours start from the same numbers. CLASS keeps its own
(default) precision settings — the comparison is against CLASS as a user runs it — except the
recombination model: CLASS's RECFAST with photoionisation at the radiation temperature, the
physics of ``boltzmann.thermodynamics`` (CLASS's default HyRec moves TT and EE by ≈ 2e-3, a
physics difference, docs/cmb.md).

CLASS's k sampling of the C_ℓ follows ``l_max_scalars``: its spectra at low ℓ are its accurate
ones only when l_max_scalars is large (measured with classy 3.4.1, at ℓ ≤ 30 against
l_max_scalars = 2500: 35 % off at l_max_scalars = 30, 2e-4 (TT) and 1e-2 (EE) at 500, 3e-5 and
3.5e-3 at 1000). ``run_class`` therefore runs CLASS to at least ``CLASS_L_MAX_MIN`` and returns
the ℓ of the run.

``run_class(config, k, zs)`` needs classy (``pip install classy==3.4.1.0``, the ``reference``
extra); without it ``ClassUnavailable`` says so. It returns CLASS's P_m, P_cb at our k and
redshifts and its C_ℓ as a ``boltzmann.cmb.ClSpectra`` (μK², every ℓ from 2 to l_max), which the
CLI writes next to ours (class_pk.csv, class_cl.csv, class_cl_lensed.csv) and plots as ratios.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np

__all__ = ["ClassUnavailable", "ClassReference", "available", "class_parameters", "run_class",
           "RECOMBINATION", "CLASS_L_MAX_MIN"]

#: CLASS's settings for the recombination physics this code implements
RECOMBINATION = {"recombination": "RECFAST", "recfast_photoion_dependence": "Trad"}
#: the smallest l_max_scalars CLASS is run with (its low-ℓ accuracy needs it; module docstring)
CLASS_L_MAX_MIN = 2500


class ClassUnavailable(RuntimeError):
    """classy (CLASS's Python wrapper) is not installed."""


def available() -> bool:
    """Whether classy is installed (found on the path; loading it is left to ``run_class``)."""
    return importlib.util.find_spec("classy") is not None


def _join(values) -> str:
    return ",".join(repr(float(v)) for v in np.atleast_1d(np.asarray(values, np.float64)))


def class_parameters(config, *, pk: bool = True, cl: bool = True) -> dict:
    """CLASS input (CLASS's names) for a loaded ``boltzmann.Config``: its cosmology, its
    redshifts and largest k (with ``pk``), its C_ℓ request (with ``cl``: tCl/pCl/lCl, lensing,
    l_max_scalars) and ``RECOMBINATION``."""
    c = config.cosmology
    pars = {"h": float(c.h), "omega_b": float(c.omega_b), "omega_cdm": float(c.omega_cdm),
            "A_s": float(c.A_s), "n_s": float(c.n_s), "k_pivot": float(c.k_pivot),
            "tau_reio": float(c.tau_reio), "YHe": float(c.YHe), "T_cmb": float(c.T_cmb),
            "N_ur": float(c.N_ur), "gauge": "synchronous", **RECOMBINATION}
    n_ncdm = int(np.asarray(c.m_ncdm).size)
    if n_ncdm:
        t = np.broadcast_to(np.asarray(c.T_ncdm, np.float64), (n_ncdm,))
        pars.update(N_ncdm=n_ncdm, m_ncdm=_join(c.m_ncdm), deg_ncdm=_join(c.deg_ncdm),
                    T_ncdm=_join(t))
    if c.use_fld:
        pars.update(Omega_Lambda=0.0, w0_fld=float(c.w0_fld), wa_fld=float(c.wa_fld),
                    use_ppf="yes" if getattr(c, "use_ppf", False) else "no",
                    cs2_fld=float(getattr(c, "cs2_fld", 1.0)))
    out = config.output
    tokens = []
    if pk:
        zs = sorted({float(z) for z in out.z})
        k = out.k_grid(float(c.h))
        tokens.append("mPk")
        pars.update({"z_pk": _join(zs), "P_k_max_1/Mpc": 1.01 * float(np.max(k))})
    spectra = set(getattr(out, "cl", ()) or ())
    if cl and spectra:
        tokens += (["tCl"] if spectra & {"TT", "TE"} else []) \
            + (["pCl"] if spectra & {"EE", "TE", "BB"} else []) \
            + (["lCl"] if "PP" in spectra else [])
        pars.update({"lensing": "yes" if out.lensing else "no", "l_max_scalars": int(out.l_max)})
    pars["output"] = ",".join(tokens)
    return pars


@dataclass(frozen=True)
class ClassReference:
    """CLASS's numbers for one run: parameters (the CLASS input), version, pk_m/pk_cb ({z: P(k)}
    [Mpc³] at the run's k, or None), cl (a ClSpectra in μK², or None)."""

    parameters: dict
    version: str
    pk_m: dict | None
    pk_cb: dict | None
    cl: object | None


def _spectra(raw: dict, lensed: dict | None, l_max: int, T_cmb: float):
    """A ClSpectra (μK²; PP dimensionless) from classy's dimensionless dicts."""
    from .cmb import ClSpectra

    ell = np.arange(2, l_max + 1)
    t2 = (1e6 * T_cmb) ** 2
    names = {"tt": "TT", "ee": "EE", "te": "TE", "pp": "PP"}
    cl = {ours: np.asarray(raw[theirs])[ell] * (1.0 if ours == "PP" else t2)
          for theirs, ours in names.items() if theirs in raw}
    lensed_cl = None
    if lensed is not None:
        lensed_cl = {ours: np.asarray(lensed[theirs])[ell] * t2
                     for theirs, ours in (("tt", "TT"), ("ee", "EE"), ("te", "TE"),
                                          ("bb", "BB")) if theirs in lensed}
    return ClSpectra(ell=ell, cl=cl, lensed=lensed_cl, T_cmb=T_cmb)


def run_class(config, k=None, zs=None) -> ClassReference:
    """Run CLASS (classy) with ``class_parameters(config)``: P_m, P_cb at ``k`` [1/Mpc] and
    ``zs`` (when both are given) and the config's C_ℓ (when ``output.cl`` is set).

    Raises ``ClassUnavailable`` without classy, and classy's own errors when CLASS fails."""
    try:
        import classy
        from classy import Class
    except ImportError as exc:
        raise ClassUnavailable("CLASS's Python wrapper classy is not installed: pip install "
                               "classy==3.4.1.0 (the 'reference' extra, a 3-minute build)") from exc
    want_pk = k is not None and zs is not None
    n_ncdm = int(np.asarray(config.cosmology.m_ncdm).size)
    pars = class_parameters(config, pk=want_pk)
    if want_pk:
        kmax = 1.01 * float(np.max(k))
        pars["P_k_max_1/Mpc"] = max(kmax, float(pars.get("P_k_max_1/Mpc", 0.0)))
        pars["z_pk"] = _join(sorted({float(z) for z in zs}))
    if "l_max_scalars" in pars:
        pars["l_max_scalars"] = max(int(pars["l_max_scalars"]), CLASS_L_MAX_MIN)
    M = Class()
    M.set(pars)
    try:
        M.compute()
        pk_m = pk_cb = None
        if want_pk:
            kk = np.asarray(k, np.float64)
            pk_m = {z: np.array([M.pk_lin(float(q), float(z)) for q in kk]) for z in zs}
            # CLASS has P_cb only with massive neutrinos; without them P_cb = P_m (as ours)
            pk_cb = pk_m if n_ncdm == 0 else {
                z: np.array([M.pk_cb_lin(float(q), float(z)) for q in kk]) for z in zs}
        spectra = None
        if getattr(config.output, "cl", ()):
            l_max = int(config.output.l_max)
            raw = M.raw_cl(l_max)
            lensed = M.lensed_cl(l_max) if config.output.lensing else None
            spectra = _spectra(raw, lensed, l_max, float(config.cosmology.T_cmb))
    finally:
        M.struct_cleanup()
        M.empty()
    return ClassReference(parameters=pars, version=str(getattr(classy, "__version__", "?")),
                          pk_m=pk_m, pk_cb=pk_cb, cl=spectra)
