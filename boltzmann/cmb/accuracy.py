"""Our C_ℓ against the CLASS references in tests/data (made by tests/data/generate_cl.py).

``REFERENCES`` names, per case, the config whose cosmology was run and the reference file;
``deviations(result, reference)`` gives max |ours/CLASS − 1| per spectrum and ℓ range (TE as
|ΔD_ℓ^TE| / √(D^TT D^EE), since TE crosses zero), the numbers of docs/cmb.md's accuracy tables
and of tests/test_cmb.py's comparison with CLASS.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["REFERENCES", "LENSED_REFERENCES", "RANGES", "COLUMNS", "load_reference",
           "deviations"]

_REPO = Path(__file__).resolve().parents[2]
#: case -> (config, reference csv) relative to the repository root
REFERENCES = {
    "lcdm": ("configs/planck_cl.yaml", "tests/data/class_cl.csv"),
    "heavy_nu": ("configs/wcdm_heavy_nu.yaml", "tests/data/class_cl_wcdm_heavy_nu.csv"),
    "desi_w0wa": ("configs/desi_w0wa.yaml", "tests/data/class_cl_ppf_desi.csv"),
}
#: the ℓ ranges of the accuracy tables
RANGES = ((2, 29), (30, 500), (501, 1500), (1501, 2000), (2001, 2500))
#: reference csv columns
COLUMNS = {"TT": 1, "EE": 2, "TE": 3, "PP": 4, "TT_lensed": 5, "EE_lensed": 6, "TE_lensed": 7,
           "BB_lensed": 8}


#: case -> a reference of the lensed spectra alone whose unlensed input reaches further
#: (generate_cl.py --lensed-input 3500: to ℓ = 4500).  The main reference lenses from input to
#: 3500, where its own lensed BB above ℓ = 1500 (1.8e-2 at 1500-2000, 11 % at 2000-2500) and TT
#: above 2000 (2.3e-3) are not converged (docs/cmb.md, Lensing).
LENSED_REFERENCES = {"lcdm": "tests/data/class_cl_lensed_l3500.csv",
                     "desi_w0wa": "tests/data/class_cl_ppf_desi_lensed_l3500.csv",
                     "heavy_nu": "tests/data/class_cl_wcdm_heavy_nu_lensed_l3500.csv"}


def load_reference(case: str) -> np.ndarray:
    """The reference table (ℓ, then the COLUMNS) of ``case``; its lensed columns from
    ``LENSED_REFERENCES`` where the case has one."""
    ref = np.loadtxt(_REPO / REFERENCES[case][1], delimiter=",")
    if case in LENSED_REFERENCES:
        lensed = np.loadtxt(_REPO / LENSED_REFERENCES[case], delimiter=",")
        if not np.array_equal(lensed[:, 0], ref[:, 0]):
            raise ValueError(f"{LENSED_REFERENCES[case]}: other multipoles than "
                             f"{REFERENCES[case][1]}")
        for j, name in enumerate(("TT_lensed", "EE_lensed", "TE_lensed", "BB_lensed")):
            ref[:, COLUMNS[name]] = lensed[:, 1 + j]
    return ref


def deviations(result, ref: np.ndarray, ranges=RANGES) -> dict:
    """{(spectrum, (lo, hi)): max deviation} of a lensed ``ClSpectra`` run (every ℓ from 2)
    against ``ref`` over the reference's multipoles in each range."""
    d = {**result.d_ell(), **{f"{k}_lensed": v for k, v in result.d_ell(lensed=True).items()}}
    ell = ref[:, 0].astype(int)
    out = {}
    for name, col in COLUMNS.items():
        if name not in d:
            continue
        ours = np.asarray(d[name])[ell - 2]
        if name.startswith("TE"):
            suffix = name[2:]
            dev = np.abs(ours - ref[:, col]) / np.sqrt(ref[:, COLUMNS["TT" + suffix]]
                                                       * ref[:, COLUMNS["EE" + suffix]])
        else:
            dev = np.abs(ours / ref[:, col] - 1.0)
        for lo, hi in ranges:
            sel = (ell >= lo) & (ell <= hi)
            if sel.any():
                out[(name, (lo, hi))] = float(np.max(dev[sel]))
    return out
