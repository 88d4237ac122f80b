#!/usr/bin/env python
"""Generate class_thermo_extra.csv: CLASS (HyRec) x_e(z) and T_b(z) for cosmologies other than
the main reference, so that the recombination tests show the physics generalises.

Run from anywhere:  python generate_thermo_extra.py   (needs classy; ~10 s on 2 cores)

Output (next to this file): long-format CSV with columns
    case, z, x_e, T_b [K]
(exact CLASS thermodynamics rows, subsampled ~log-uniformly in 1+z, 400 per case).  The second
header line is JSON: per case the CLASS inputs and CLASS's derived z_star, z_rec, z_d.
Only the thermodynamics is computed (no perturbations); recombination = CLASS default (HyRec),
reionisation = CLASS default (tanh, reio_camb). Massless neutrinos (N_ur = 3.044).
"""
import json
from pathlib import Path

import classy
import numpy as np
from classy import Class

OUT = Path(__file__).resolve().parent / "class_thermo_extra.csv"
ROWS_PER_CASE = 400

# Case 0: high baryons, low CDM, high h, more helium.  Case 1: low baryons, high CDM, low h,
# less helium, and a different CMB temperature (moves recombination to higher z).
CASES = [
    {"h": 0.72, "omega_b": 0.025, "omega_cdm": 0.11, "YHe": 0.25, "T_cmb": 2.7255, "tau_reio": 0.06},
    {"h": 0.65, "omega_b": 0.019, "omega_cdm": 0.13, "YHe": 0.23, "T_cmb": 2.65, "tau_reio": 0.07},
]
COMMON = {"A_s": 2.1e-9, "n_s": 0.965, "N_ur": 3.044}


def subsample(z, n):
    """Indices of the rows nearest to n values uniform in ln(1+z) (no interpolation)."""
    lz = np.log1p(np.asarray(z))
    order = np.argsort(lz)
    pos = np.searchsorted(lz[order], np.linspace(lz.min(), lz.max(), n))
    return np.unique(order[np.clip(pos, 0, len(lz) - 1)])


def main():
    rows, meta = [], []
    for i, case in enumerate(CASES):
        M = Class()
        M.set({**case, **COMMON})
        M.compute()
        th = M.get_thermodynamics()
        derived = M.get_current_derived_parameters(["z_star", "z_rec", "z_d", "tau_star", "tau_d", "z_reio"])
        M.struct_cleanup()
        M.empty()
        z = np.asarray(th["z"])
        idx = subsample(z, ROWS_PER_CASE)
        idx = idx[np.argsort(z[idx])]
        rows.append(np.column_stack([np.full(len(idx), i), z[idx], np.asarray(th["x_e"])[idx],
                                     np.asarray(th["Tb [K]"])[idx]]))
        meta.append({"class_input": {**case, **COMMON}, "derived": {k: float(v) for k, v in derived.items()}})
    header = "\n".join([
        f"CLASS {classy.__version__} thermodynamics (HyRec, massless nu), exact rows subsampled in ln(1+z); "
        "made by generate_thermo_extra.py",
        json.dumps({"cases": meta}),
        "case,z,x_e,T_b",
    ])
    np.savetxt(OUT, np.vstack(rows), delimiter=",", header=header, comments="# ",
               fmt=["%d", "%.9e", "%.9e", "%.9e"])
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
