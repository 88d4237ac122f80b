#!/usr/bin/env python
"""CLASS references for the background observables and derived parameters likelihoods use:
H(z), D_A(z), D_M(z), the scale-independent growth D(z) and f(z), σ8(z), and θ_s, θ_*, r_d,
z_d, z_star, z_rec, z_reio, age, Neff, Omega_m, Omega_Lambda / Omega_fld, σ8.

Run:  nice -n 5 python tests/data/generate_background.py   (needs classy, numpy, pyyaml; ~1 min)
Cases (the cosmology is read from the config itself, so the two cannot drift apart):
  lcdm            configs/lcdm.yaml (one 0.06 eV neutrino, Λ)
  wcdm_heavy_nu   configs/wcdm_heavy_nu.yaml (w0-wa fluid, c_s^2 = 1, use_ppf = no, two 0.1 eV
                  neutrinos): the fluid's background and Omega_fld
Writes next to this file:
  class_background.csv   long format case,z,H_1/Mpc,D_A_Mpc,D_M_Mpc,D,f,sigma8 at REDSHIFTS
                         (CLASS's own functions Hubble, angular_distance, comoving_distance,
                         scale_independent_growth_factor[_f], sigma(8 Mpc/h, z); sigma8 is NaN
                         above z_max_pk)
  class_background.yaml  per case: CLASS input, precision, get_current_derived_parameters, timing
The precision is generate.py's raised set: the background and thermodynamics do not depend on
it beyond ~1e-6; σ8 carries CLASS's late-time ncdm fluid approximation (generate_extra.py
measured its effect on P(k) at ~1e-3 for two 0.1 eV neutrinos; switching it off costs CLASS
~20 min here, for a number these files are not used to test). Synchronous gauge, HyRec and tanh
reionisation (CLASS defaults), YHe fixed to the config's value.
"""
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
CONFIGS = OUT.parents[1] / "configs"
CASES = {"lcdm": "lcdm.yaml", "wcdm_heavy_nu": "wcdm_heavy_nu.yaml"}
#: DESI DR2 BAO effective redshifts, round numbers, and the CMB era
REDSHIFTS = [0.0, 0.1, 0.295, 0.5, 0.51, 0.706, 0.934, 1.0, 1.321, 1.484, 2.0, 2.33, 3.0, 5.0,
             10.0, 100.0, 1000.0, 1090.0]
Z_MAX_PK = 3.0
# the raised precision of every reference (class_precision.py)
PRECISION = PRECISION_CLASS
DERIVED = ["100*theta_s", "100*theta_star", "rs_d", "rs_rec", "rs_star", "ra_rec", "z_d",
           "z_star", "z_rec", "z_reio", "tau_reio", "age", "conformal_age", "Neff", "Omega_m",
           "omega_m", "Omega0_lambda", "Omega0_fld", "h", "sigma8"]
COLUMNS = ["case", "z", "H_1/Mpc", "D_A_Mpc", "D_M_Mpc", "D", "f", "sigma8"]


def _join(v):
    return ",".join(f"{x:.10g}" for x in v)


def class_input(cosmo: dict) -> dict:
    """CLASS parameters for a config's cosmology block (as generate_extra.py maps them)."""
    m = list(cosmo.get("m_ncdm", []))
    n = len(m)
    t = cosmo.get("T_ncdm", 0.71611)
    t = list(t) if isinstance(t, list) else [t] * n
    pars = {k: cosmo[k] for k in ("h", "omega_b", "omega_cdm", "n_s", "tau_reio", "A_s",
                                  "ln10^{10}A_s", "k_pivot", "YHe", "T_cmb", "N_ur")
            if k in cosmo}
    if n:
        pars.update(N_ncdm=n, m_ncdm=_join(m), deg_ncdm=_join(cosmo.get("deg_ncdm", [1.0] * n)),
                    T_ncdm=_join(t))
    if "w0_fld" in cosmo or "wa_fld" in cosmo:
        pars.update(Omega_Lambda=0.0, w0_fld=cosmo.get("w0_fld", -1.0),
                    wa_fld=cosmo.get("wa_fld", 0.0), cs2_fld=1.0, use_ppf="no")
    pars.update({"output": "mPk", "gauge": "synchronous", "P_k_max_h/Mpc": 11.0,
                 "z_max_pk": Z_MAX_PK})
    return pars


def run_case(name: str):
    cosmo = yaml.safe_load((CONFIGS / CASES[name]).read_text())["cosmology"]
    inputs = class_input(cosmo)
    precision = dict(PRECISION)
    M = Class()
    M.set({**inputs, **precision})
    t0, c0 = time.perf_counter(), time.process_time()
    M.compute()
    timing = {"wall": round(time.perf_counter() - t0, 2), "cpu": round(time.process_time() - c0, 2)}
    z = np.asarray(REDSHIFTS)
    rows = {
        "z": z, "H_1/Mpc": M.Hubble(z), "D_A_Mpc": M.angular_distance(z),
        "D_M_Mpc": M.comoving_distance(z), "D": M.scale_independent_growth_factor(z),
        "f": M.scale_independent_growth_factor_f(z),
        "sigma8": np.array([M.sigma(8.0, zz, h_units=True) if zz <= Z_MAX_PK else np.nan
                            for zz in z]),
    }
    derived = {k: float(v) for k, v in M.get_current_derived_parameters(DERIVED).items()}
    M.struct_cleanup()
    M.empty()
    meta = {"config": f"configs/{CASES[name]}", "class_input": inputs,
            "class_precision": precision, "derived": derived, "timing_s": timing}
    return rows, meta


def main(argv=None):
    names = (sys.argv[1:] if argv is None else argv) or list(CASES)
    lines, meta = [], {}
    for name in names:
        rows, meta[name] = run_case(name)
        for i in range(len(REDSHIFTS)):
            lines.append(f"{name}," + ",".join(f"{rows[c][i]:.16e}" for c in COLUMNS[1:]))
        print(f"[{name}] 100*theta_s = {meta[name]['derived']['100*theta_s']:.8f}, "
              f"rs_d = {meta[name]['derived']['rs_d']:.5f} Mpc, "
              f"sigma8 = {meta[name]['derived']['sigma8']:.6f}", flush=True)
    header = [f"# CLASS {classy.__version__} background observables (generate_background.py); "
              "inputs, precision and derived numbers in class_background.yaml",
              "# H = H/c in 1/Mpc, distances in Mpc; D, f: CLASS's scale-independent growth "
              "factor (D(0) = 1) and rate; sigma8 = sigma(8 Mpc/h, z), NaN above z_max_pk",
              "# " + ",".join(COLUMNS)]
    (OUT / "class_background.csv").write_text("\n".join(header + lines) + "\n")
    doc = {"description": "CLASS background observables and derived parameters for the configs "
                          "named below. Made by generate_background.py.",
           "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "codes": {"classy": classy.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
           "redshifts": REDSHIFTS, "z_max_pk": Z_MAX_PK, "cases": meta}
    (OUT / "class_background.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    return 0


if __name__ == "__main__":
    sys.exit(main())
