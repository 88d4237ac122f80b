#!/usr/bin/env python
"""CLASS references for configs/wcdm_heavy_nu.yaml (w0-wa fluid, two 0.1 eV neutrinos) and two
variants of it that separate the fluid from the neutrinos.

Run:  nice -n 5 python tests/data/generate_extra.py [case ...]   (needs classy, numpy, pyyaml)
Cases (default: all three):
  wcdm_heavy_nu     the config as it is
  wcdm_massless     the config's fluid (w0, wa) with massless neutrinos only (N_ur = 3.044,
                    no ncdm): tests the fluid alone
  lcdm_heavy_nu     the config's two 0.1 eV neutrinos with a cosmological constant (no
                    w0_fld/wa_fld): tests the neutrinos alone
Writes next to this file, per case:
  class_<case>_pk.csv   CLASS linear P_m (and P_cb with ncdm) [Mpc^3] at the config's redshifts,
                        k [1/Mpc] = h * logspace(log10 k_min, log10 k_max, 300) h/Mpc
  class_<case>.yaml     CLASS input, version, precision, sigma8 / sigma8_cb and other derived
                        numbers, a few background values, timing
The cosmology is read from the config itself (so the two cannot drift apart) and mapped to
CLASS names:
  * dark energy: Omega_Lambda = 0, the fluid takes the closure (Omega_fld), w0_fld, wa_fld,
    cs2_fld = 1, use_ppf = no (CLASS's rest-frame c_s^2 fluid, as ours);
  * massive neutrinos: one CLASS ncdm species per config entry (N_ncdm = len(m_ncdm)), with the
    config's m_ncdm [eV], deg_ncdm and T_ncdm [T_cmb]; N_ur as given.
Precision: PRECISION_CLASS of class_precision.py (same raised settings as the other references) plus
NCDM_EXACT: CLASS's ncdm fluid approximation switched off and l_max_ncdm = 60.  With generate.py's
settings alone CLASS replaces the massive-neutrino hierarchy by a fluid once k tau > 51; for these
two 0.1 eV neutrinos that shifts P_m by +2e-3 at k ~ 0.05-0.1 h/Mpc (P_cb by 1.5e-3) relative to
the full hierarchy (measured: CLASS with and without the approximation; our code, which always
evolves the full hierarchy, agrees with the latter).  The yaml records the difference.
Synchronous gauge, HyRec and tanh reionisation (CLASS defaults), YHe fixed to the config value.
"""
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import yaml
import classy
from classy import Class

from class_precision import PRECISION_CLASS  # the shared raised precision

OUT = Path(__file__).resolve().parent
CONFIG = OUT.parents[1] / "configs" / "wcdm_heavy_nu.yaml"


#: lcdm_heavy_nu is a diagnostic (run it by name); its files are not kept in the repository
DEFAULT_CASES = ["wcdm_heavy_nu", "wcdm_massless"]


def _massless(c):
    c = {k: v for k, v in c.items() if k not in ("m_ncdm", "deg_ncdm", "T_ncdm", "N_ncdm")}
    return {**c, "N_ur": 3.044}


def _no_fluid(c):
    return {k: v for k, v in c.items() if k not in ("w0_fld", "wa_fld")}


#: case name -> (description, transformation of the config's cosmology block)
CASES = {
    "wcdm_heavy_nu": ("configs/wcdm_heavy_nu.yaml as it is", lambda c: dict(c)),
    "wcdm_massless": ("configs/wcdm_heavy_nu.yaml's fluid with massless neutrinos only "
                      "(N_ur = 3.044, no ncdm)", _massless),
    "lcdm_heavy_nu": ("configs/wcdm_heavy_nu.yaml's two 0.1 eV neutrinos with a cosmological "
                      "constant (no w0_fld, wa_fld)", _no_fluid),
}
# the raised precision of every reference (class_precision.py)
PRECISION = PRECISION_CLASS
#: the massive-neutrino hierarchy without CLASS's late-time fluid approximation (see docstring)
NCDM_EXACT = {"ncdm_fluid_approximation": 3, "l_max_ncdm": 60}
N_K = 300
DERIVED = ["sigma8", "sigma8_cb", "Omega_m", "omega_m", "Neff", "YHe", "z_reio", "z_star",
           "100*theta_s", "z_d", "rs_d", "age", "conformal_age"]
BG_Z = [0.0, 0.5, 1.0, 2.0, 10.0, 100.0, 1000.0]


def _join(v):
    return ",".join(f"{x:.10g}" for x in v)


def class_input(cosmo: dict, zs, k_max_h: float) -> dict:
    """CLASS parameters for the config's cosmology block (see module docstring)."""
    m = list(cosmo.get("m_ncdm", []))
    n = len(m)
    t = cosmo.get("T_ncdm", 0.71611)
    t = list(t) if isinstance(t, list) else [t] * n
    pars = {k: cosmo[k] for k in ("h", "omega_b", "omega_cdm", "n_s", "tau_reio") if k in cosmo}
    for key in ("A_s", "ln10^{10}A_s", "k_pivot", "YHe", "T_cmb", "N_ur"):
        if key in cosmo:
            pars[key] = cosmo[key]
    if n:
        pars.update(N_ncdm=n, m_ncdm=_join(m), deg_ncdm=_join(cosmo.get("deg_ncdm", [1.0] * n)),
                    T_ncdm=_join(t))
    if "w0_fld" in cosmo or "wa_fld" in cosmo:
        pars.update(Omega_Lambda=0.0, w0_fld=cosmo.get("w0_fld", -1.0),
                    wa_fld=cosmo.get("wa_fld", 0.0), cs2_fld=1.0, use_ppf="no")
    pars.update({"output": "mPk", "gauge": "synchronous", "P_k_max_h/Mpc": 1.1 * k_max_h,
                 "z_pk": _join(zs)})
    return pars


def main(argv=None):
    names = (sys.argv[1:] if argv is None else argv) or DEFAULT_CASES
    for name in names:
        run_case(name)
    return 0


def _compute(pars, k, zs, has_cb):
    M = Class()
    M.set(pars)
    t0, c0 = time.perf_counter(), time.process_time()
    M.compute()
    timing = {"wall": round(time.perf_counter() - t0, 2), "cpu": round(time.process_time() - c0, 2)}
    cols = {"k_1/Mpc": k}
    for z in zs:
        cols[f"P_m_z{z:g}_Mpc3"] = np.array([M.pk_lin(kk, z) for kk in k])
    for z in zs if has_cb else []:
        cols[f"P_cb_z{z:g}_Mpc3"] = np.array([M.pk_cb_lin(kk, z) for kk in k])
    return M, cols, timing


def run_case(name):
    cfg = yaml.safe_load(CONFIG.read_text())
    what, transform = CASES[name]
    cosmo, output = transform(cfg["cosmology"]), cfg["output"]
    has_cb = bool(cosmo.get("m_ncdm"))
    zs = [float(z) for z in output["z"]]
    h = float(cosmo["h"])
    k_h = np.logspace(np.log10(output.get("k_min", 1e-4)), np.log10(output.get("k_max", 10.0)),
                      N_K)
    k = k_h * h
    inputs = class_input(cosmo, zs, float(output.get("k_max", 10.0)))
    precision = {**PRECISION, **(NCDM_EXACT if has_cb else {})}
    fa_check = {}
    if has_cb:   # generate.py's precision alone (ncdm fluid approximation on), for the record
        M, cols_fa, t_fa = _compute({**inputs, **PRECISION}, k, zs, has_cb)
        s8_fa = {"sigma8": float(M.sigma8()), "sigma8_cb": float(M.sigma8_cb())}
        M.struct_cleanup()
        M.empty()
    M, cols, timing = _compute({**inputs, **precision}, k, zs, has_cb)
    names = list(cols)
    if has_cb:
        low = k_h <= 1.0
        for n in names[1:]:
            r = cols_fa[n] / cols[n] - 1.0
            fa_check[n] = {"max_abs_k<=1h/Mpc": float(np.max(np.abs(r[low]))),
                           "at_k_h/Mpc": float(k_h[low][np.argmax(np.abs(r[low]))]),
                           "max_abs_all_k": float(np.max(np.abs(r)))}
        fa_check.update({f"{key}_with_approximation": v for key, v in s8_fa.items()})
        fa_check["timing_s_with_approximation"] = t_fa
    header = "\n".join([
        f"CLASS {classy.__version__} linear P(k), raised precision, for {what}; see class_{name}.yaml",
        f"k in 1/Mpc (k = h * logspace(log10 k_min, log10 k_max, {N_K}) h/Mpc, h = {h}), "
        "P in Mpc^3; P_m = cdm+b+ncdm, P_cb = cdm+b",
        ",".join(names)])
    np.savetxt(OUT / f"class_{name}_pk.csv", np.column_stack([cols[n] for n in names]),
               delimiter=",", fmt="%.9e", header=header, comments="# ")

    wanted = [d for d in DERIVED if has_cb or d != "sigma8_cb"]
    derived = {key: float(v) for key, v in M.get_current_derived_parameters(wanted).items()}
    bg = M.get_background()
    zb = np.asarray(bg["z"])[::-1]
    background = {"z": BG_Z}
    for col, label in (("H [1/Mpc]", "H_1/Mpc"), ("(.)rho_fld", "rho_fld_1/Mpc2"),
                       ("(.)w_fld", "w_fld")):
        if col in bg:
            background[label] = [float(np.interp(z, zb, np.asarray(bg[col])[::-1])) for z in BG_Z]
    de = "(.)rho_fld" if "(.)rho_fld" in bg else "(.)rho_lambda"
    derived["Omega_fld" if de == "(.)rho_fld" else "Omega_Lambda"] = float(
        np.asarray(bg[de])[-1] / np.asarray(bg["(.)rho_crit"])[-1])
    derived["Omega_ncdm_h2_total"] = float(M.Omega_nu * h * h) if has_cb else 0.0
    meta = {
        "description": f"CLASS reference for {what}. Made by generate_extra.py.",
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "codes": {"classy": classy.__version__, "numpy": np.__version__,
                  "python": platform.python_version()},
        "units": {"k": "1/Mpc (no h)", "P": "Mpc^3 (no h)", "h": h},
        "config": {"cosmology": cosmo, "output_z": zs},
        "class_input": inputs,
        "class_precision": precision,
        "notes": "recombination = CLASS default (HyRec); reionisation = CLASS default tanh; "
                 "Omega_fld (or Omega_Lambda) from flatness; fluid: rest-frame c_s^2 = 1, no PPF"
                 + ("; ncdm: full hierarchy to z = 0 (ncdm_fluid_approximation = 3, "
                    "l_max_ncdm = 60), see generate_extra.py" if has_cb else ""),
        "files": {f"class_{name}_pk.csv": {"rows": int(len(k)), "columns": names}},
        "derived": derived,
        "background_interpolated_in_z": background,
        "timing_s": timing,
    }
    if has_cb:
        meta["ncdm_fluid_approximation_effect"] = {
            "what": "generate.py precision alone (CLASS ncdm fluid approximation at k tau > 51, "
                    "l_max_ncdm 30) relative to this file: P_approx / P_this - 1",
            **fa_check}
    (OUT / f"class_{name}.yaml").write_text(
        yaml.safe_dump(meta, sort_keys=False, default_flow_style=None, width=110))
    M.struct_cleanup()
    M.empty()
    print(name, json.dumps({"derived": derived, "timing_s": timing, "fa": fa_check}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
