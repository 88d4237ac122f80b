"""Our C_ℓ against the CLASS references in tests/data (made by tests/data/generate_cl.py).

``REFERENCES`` names, per case, the config whose cosmology was run and the reference file;
``deviations(result, reference)`` gives max |ours/CLASS − 1| per spectrum and ℓ range (TE as
|ΔD_ℓ^TE| / √(D^TT D^EE), since TE crosses zero), the numbers of docs/cmb.md's accuracy tables
and of tests/test_cmb.py's comparison with CLASS.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["REFERENCES", "RANGES", "COLUMNS", "load_reference", "deviations"]

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


def load_reference(case: str) -> np.ndarray:
    """The reference table (ℓ, then the COLUMNS) of ``case``."""
    return np.loadtxt(_REPO / REFERENCES[case][1], delimiter=",")


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
