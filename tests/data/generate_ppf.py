#!/usr/bin/env python
"""CLASS references for the PPF dark energy (use_ppf = yes): a w(a) that crosses -1 and one that
does not, both with configs/desi_w0wa.yaml's other parameters (one 0.06 eV neutrino).

Run:  nice -n 5 python tests/data/generate_ppf.py [case ...]   (needs classy, numpy, pyyaml)
Cases (default: both):
  ppf_desi   configs/desi_w0wa.yaml as it is: w0 = -0.75, wa = -0.86 (DESI DR2 best fit), w
             crosses -1 at a = 0.709
  ppf_wcdm   the same with w0 = -0.9, wa = 0.1 (w > -1 at every a)
Writes next to this file, per case:
  class_<case>_pk.csv   CLASS linear P_m and P_cb [Mpc^3] at z = 0, 0.5, 1, 2 (either side of the
                        crossing), k [1/Mpc] = h * logspace(-4, 1, 300) h/Mpc
  class_<case>.yaml     CLASS input, version, precision, sigma8 / sigma8_cb and other derived
                        numbers, timing, and ``ppf_effect``: how far CLASS's own PPF P(k) is from
                        its rest-frame fluid (use_ppf = no) for the non-crossing case -- the size
                        of what the PPF test resolves
The cosmology is read from the config (so the two cannot drift apart) and mapped to CLASS names by
generate_extra.class_input, with use_ppf = yes and the config's cs2_fld.  Precision: the shared
raised settings (class_precision.py) plus generate_extra's NCDM_EXACT (no late-time ncdm fluid
approximation, l_max_ncdm = 60), since our code evolves the full neutrino hierarchy.
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

from class_precision import PRECISION_CLASS
from generate_extra import NCDM_EXACT, _compute, class_input

OUT = Path(__file__).resolve().parent
CONFIG = OUT.parents[1] / "configs" / "desi_w0wa.yaml"
ZS = [0.0, 0.5, 1.0, 2.0]
N_K = 300
DERIVED = ["sigma8", "sigma8_cb", "Omega_m", "Neff", "z_reio", "100*theta_s", "rs_d", "age"]
#: case -> (description, (w0, wa) or None for the config's own)
CASES = {
    "ppf_desi": ("configs/desi_w0wa.yaml as it is (w crosses -1 at a = 0.709)", None),
    "ppf_wcdm": ("configs/desi_w0wa.yaml with w0 = -0.9, wa = 0.1 (no crossing)", (-0.9, 0.1)),
}


def _inputs(cosmo, k_max_h, use_ppf):
    pars = class_input(cosmo, ZS, k_max_h)
    pars.update(use_ppf="yes" if use_ppf else "no", cs2_fld=float(cosmo.get("cs2_fld", 1.0)))
    return pars


def _relative(a, b, k_h):
    """max |a/b - 1| over k <= 1 h/Mpc and over all k, per column."""
    out = {}
    for name in list(a)[1:]:
        r = a[name] / b[name] - 1.0
        out[name] = {"max_abs_k<=1h/Mpc": float(np.max(np.abs(r[k_h <= 1.0]))),
                     "max_abs_all_k": float(np.max(np.abs(r)))}
    return out


def run_case(name):
    cfg = yaml.safe_load(CONFIG.read_text())
    what, w = CASES[name]
    cosmo = {key: v for key, v in cfg["cosmology"].items() if key != "use_ppf"}
    if w is not None:
        cosmo["w0_fld"], cosmo["wa_fld"] = w
    h = float(cosmo["h"])
    k_h = np.logspace(-4, 1, N_K)
    k = k_h * h
    inputs = _inputs(cosmo, 10.0, use_ppf=True)
    precision = {**PRECISION_CLASS, **NCDM_EXACT}
    effect = None
    if w is not None:   # CLASS's PPF against its own fluid, at the shared precision alone
        M, ppf, _ = _compute({**inputs, **PRECISION_CLASS}, k, ZS, True)
        M.struct_cleanup()
        M.empty()
        M, fluid, _ = _compute({**_inputs(cosmo, 10.0, use_ppf=False), **PRECISION_CLASS}, k,
                               ZS, True)
        M.struct_cleanup()
        M.empty()
        effect = {"what": "CLASS use_ppf = yes over use_ppf = no, both at class_precision.py's "
                          "settings: P_ppf / P_fluid - 1", **_relative(ppf, fluid, k_h)}
    M, cols, timing = _compute({**inputs, **precision}, k, ZS, True)
    names = list(cols)
    header = "\n".join([
        f"CLASS {classy.__version__} linear P(k), use_ppf = yes, raised precision, for {what}; "
        f"see class_{name}.yaml",
        f"k in 1/Mpc (k = h * logspace(-4, 1, {N_K}) h/Mpc, h = {h}), P in Mpc^3; "
        "P_m = cdm+b+ncdm, P_cb = cdm+b",
        ",".join(names)])
    np.savetxt(OUT / f"class_{name}_pk.csv", np.column_stack([cols[n] for n in names]),
               delimiter=",", fmt="%.9e", header=header, comments="# ")
    derived = {key: float(v) for key, v in M.get_current_derived_parameters(DERIVED).items()}
    meta = {
        "description": f"CLASS PPF reference for {what}. Made by generate_ppf.py.",
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "codes": {"classy": classy.__version__, "numpy": np.__version__,
                  "python": platform.python_version()},
        "units": {"k": "1/Mpc (no h)", "P": "Mpc^3 (no h)", "h": h},
        "config": {"cosmology": cosmo, "output_z": ZS},
        "class_input": inputs,
        "class_precision": precision,
        "notes": "PPF dark energy (use_ppf = yes, c_Gamma = 0.4 c_s); recombination = HyRec, "
                 "reionisation = tanh (CLASS defaults); Omega_fld from flatness; ncdm: full "
                 "hierarchy to z = 0 (ncdm_fluid_approximation = 3, l_max_ncdm = 60)",
        "files": {f"class_{name}_pk.csv": {"rows": int(len(k)), "columns": names}},
        "derived": derived,
        "timing_s": timing,
    }
    if effect is not None:
        meta["ppf_effect"] = effect
    (OUT / f"class_{name}.yaml").write_text(
        yaml.safe_dump(meta, sort_keys=False, default_flow_style=None, width=110))
    M.struct_cleanup()
    M.empty()
    print(name, json.dumps({"derived": derived, "timing_s": timing}), flush=True)


def main(argv=None):
    for name in (sys.argv[1:] if argv is None else argv) or list(CASES):
        run_case(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
