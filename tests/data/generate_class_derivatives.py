#!/usr/bin/env python
"""CLASS finite-difference reference for d ln P_m(k, z=0) / d theta (gradient tests, issue 5).

Run:  nice -n 5 python tests/data/generate_class_derivatives.py     (needs classy, numpy, pyyaml)
Writes next to this file:
  class_dlnpk_dtheta.csv    k [1/Mpc] and one column per parameter: d ln P_m / d theta at fixed
                            k in 1/Mpc (P in Mpc^3), z = 0
  class_dlnpk_dtheta.yaml   fiducial, steps, stencil, CLASS version and precision, step
                            convergence, timing, date
Takes ~45 CLASS runs at the raised precision of generate.py (a few minutes on 2 cores).

Fiducial: the massive-neutrino cosmology of params.yaml with dark energy as a CPL fluid at
w0 = -1, wa = 0 (c_s^2 = 1, no PPF).  CLASS (use_ppf = no) refuses any fluid whose w touches -1
((1 + w_ini)(1 + w_0) <= 0), so:
  * every run that needs w = -1 exactly (the fiducial and the steps of the eight non-dark-energy
    parameters) uses a cosmological constant instead -- a w = -1 fluid *is* Lambda: same
    background, and its perturbations vanish identically (delta' and (rho+p) theta are both
    proportional to 1 + w);
  * d/dw0 steps along w0 with wa = 0 (constant w = -1 +- delta: no touching);
  * d/dwa cannot step along wa alone (w0 = -1 would still touch -1 today).  It is obtained from
    two directional derivatives through the fiducial that never touch -1:
       D_(1,1)  = d/dw0 + d/dwa   (points (w0, wa) = (-1 + s, s): w - (-1) = s (2 - a), one sign)
       D_(2,-1) = 2 d/dw0 - d/dwa (points (-1 + 2s, -s): w - (-1) = s (1 + a), one sign)
    and d/dwa = D_(1,1) - d/dw0 is reported; 2 d/dw0 - D_(2,-1) is an independent check
    (stored in the yaml), which also tests that P is differentiable at the corner w0 = -1, wa = 0.

Massive neutrinos: with generate.py's precision alone CLASS replaces the ncdm hierarchy by a fluid
once k tau > 51; that approximation shifts P_m by ~ +2e-3 (f_nu / 0.015) at k ~ 0.05-0.1 h/Mpc
relative to the full hierarchy (measured for two 0.1 eV neutrinos, see generate_extra.py), i.e.
~6e-4 here, and its m_ncdm-dependence would bias d/dm_ncdm by ~1e-2.  The m_ncdm column therefore
runs with NCDM_EXACT (approximation off, l_max_ncdm = 50); for omega_cdm the yaml records how much
the approximation moves D(s) (ncdm_fluid_approximation_check).
``--update COL ...`` recomputes only those columns (and the check) into the existing files.

Each derivative is a central difference at step s and at s/2; the reported value is their
Richardson combination (4 D(s/2) - D(s)) / 3 (the 5-point stencil on +-s/2, +-s), and the yaml
records max |D(s) - D(s/2)| (the 2-point formula's step sensitivity) and
max |Richardson - D(s/2)| per parameter.
"""
import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import classy
from classy import Class

from class_precision import PRECISION_CLASS  # the shared raised precision

OUT = Path(__file__).resolve().parent
H = 0.6736

# the massive-nu cosmology of params.yaml (class_input.common + neutrinos.massive)
FIDUCIAL = {
    "h": H, "omega_b": 0.02237, "omega_cdm": 0.12, "ln10^{10}A_s": float(np.log(1e10 * 2.1e-9)),
    "n_s": 0.9649, "k_pivot": 0.05, "tau_reio": 0.0544, "YHe": 0.2454, "T_cmb": 2.7255,
    "N_ur": 2.0308, "N_ncdm": 1, "m_ncdm": 0.06,
}
W0, WA = -1.0, 0.0
FLUID = {"Omega_Lambda": 0.0, "cs2_fld": 1.0, "use_ppf": "no"}
# the raised precision of every reference (class_precision.py)
PRECISION = PRECISION_CLASS
NCDM_EXACT = {"ncdm_fluid_approximation": 3, "l_max_ncdm": 50}
#: columns whose runs use NCDM_EXACT on top of PRECISION (see docstring)
COLUMN_PRECISION = {"m_ncdm": NCDM_EXACT}
K_MAX = 1.0                                   # 1/Mpc, fixed in 1/Mpc so the grid ignores h
OUTPUT = {"output": "mPk", "gauge": "synchronous", "z_pk": "0", "P_k_max_1/Mpc": K_MAX}
K = np.logspace(-3, 0, 60) * H                # 1e-3..1 h/Mpc, in 1/Mpc (fiducial h)

# full steps s (the half step s/2 is also run); absolute units of each parameter
STEPS = {
    "h": 0.01 * H, "omega_b": 0.01 * 0.02237, "omega_cdm": 0.01 * 0.12,
    "ln10^{10}A_s": 0.01 * FIDUCIAL["ln10^{10}A_s"], "n_s": 0.01,
    "tau_reio": 0.01,                 # ~20%: P_m barely depends on tau_reio
    "m_ncdm": 0.01, "N_ur": 0.02, "w0_fld": 0.02, "wa_fld": 0.02,
}
COLUMNS = ["h", "omega_b", "omega_cdm", "ln10^{10}A_s", "n_s", "tau_reio", "m_ncdm", "N_ur",
           "w0_fld", "wa_fld"]
_CALLS = {"n": 0, "wall": 0.0, "cpu": 0.0}


def ln_pk(changes: dict, w0=None, wa=None, extra_precision=None) -> np.ndarray:
    """ln P_m(K, z=0) [Mpc^3] from CLASS; dark energy = Lambda when w0 is None, else the fluid."""
    pars = {**FIDUCIAL, **changes, **OUTPUT, **PRECISION, **(extra_precision or {})}
    if w0 is not None:
        pars.update(FLUID, w0_fld=w0, wa_fld=wa)
    M = Class()
    M.set(pars)
    t0, c0 = time.perf_counter(), time.process_time()
    M.compute()
    _CALLS["n"] += 1
    _CALLS["wall"] += time.perf_counter() - t0
    _CALLS["cpu"] += time.process_time() - c0
    out = np.log([M.pk_lin(k, 0.0) for k in K])
    M.struct_cleanup()
    M.empty()
    return out


def central(fn, s):
    """Central differences at steps s and s/2 of fn(offset) -> array, and their Richardson value."""
    fp, fm = fn(s), fn(-s)
    hp, hm = fn(s / 2), fn(-s / 2)
    d_full = (fp - fm) / (2 * s)
    d_half = (hp - hm) / s
    return d_full, d_half, (4 * d_half - d_full) / 3


def _conv(d_full, d_half, rich, step):
    return {"step": float(step),
            "max_abs_D(s)-D(s/2)": float(np.max(np.abs(d_full - d_half))),
            "max_abs_richardson-D(s/2)": float(np.max(np.abs(rich - d_half))),
            "max_abs_value": float(np.max(np.abs(rich)))}


def compute(columns):
    """{column: Richardson derivative}, {column: step-convergence record} for ``columns``."""
    values, conv = {}, {}
    for p in [c for c in COLUMNS[:8] if c in columns]:
        print(f"[{p}] step {STEPS[p]:.4g}", flush=True)
        extra = COLUMN_PRECISION.get(p)
        r = central(lambda d, p=p: ln_pk({p: FIDUCIAL[p] + d}, extra_precision=extra), STEPS[p])
        values[p], conv[p] = r[2], _conv(*r, STEPS[p])
        if extra:
            conv[p]["extra_precision"] = extra
    if "w0_fld" in columns or "wa_fld" in columns:
        print("[w0_fld] and directions (1,1), (2,-1) in (w0, wa)", flush=True)
        d_w0 = central(lambda d: ln_pk({}, w0=W0 + d, wa=WA), STEPS["w0_fld"])
        d_11 = central(lambda d: ln_pk({}, w0=W0 + d, wa=WA + d), STEPS["wa_fld"])
        d_2m1 = central(lambda d: ln_pk({}, w0=W0 + 2 * d, wa=WA - d), STEPS["wa_fld"] / 2)
        d_wa = tuple(a - b for a, b in zip(d_11, d_w0))
        wa_check = tuple(2 * b - a for a, b in zip(d_2m1, d_w0))
        values["w0_fld"], conv["w0_fld"] = d_w0[2], _conv(*d_w0, STEPS["w0_fld"])
        values["wa_fld"], conv["wa_fld"] = d_wa[2], _conv(*d_wa, STEPS["wa_fld"])
        conv["wa_fld"]["max_abs_diff_vs_direction_(2,-1)"] = float(
            np.max(np.abs(wa_check[2] - d_wa[2])))
    return values, conv


def fa_check(p="omega_cdm"):
    """How much CLASS's ncdm fluid approximation moves the 2-point derivative D(s) of column p."""
    s = STEPS[p]
    d = {}
    for label, extra in (("approximation_on", None), ("approximation_off", NCDM_EXACT)):
        d[label] = (ln_pk({p: FIDUCIAL[p] + s}, extra_precision=extra)
                    - ln_pk({p: FIDUCIAL[p] - s}, extra_precision=extra)) / (2 * s)
    diff = np.abs(d["approximation_on"] - d["approximation_off"])
    return {"column": p, "step": float(s), "max_abs_difference_of_D(s)": float(diff.max()),
            "at_k_1/Mpc": float(K[np.argmax(diff)]),
            "max_abs_value": float(np.max(np.abs(d["approximation_off"])))}


def main(argv=None):
    ap = argparse.ArgumentParser(description="CLASS reference d ln P / d theta")
    ap.add_argument("--update", nargs="+", metavar="COL", choices=COLUMNS,
                    help="recompute only these columns into the existing csv/yaml")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    csv_path, yaml_path = OUT / "class_dlnpk_dtheta.csv", OUT / "class_dlnpk_dtheta.yaml"
    if args.update:
        import yaml
        old = np.loadtxt(csv_path, delimiter=",")
        old_meta = yaml.safe_load(yaml_path.read_text())
        assert np.allclose(old[:, 0], K, rtol=1e-8), "k grid changed: run without --update"
        results = {p: old[:, 1 + i] for i, p in enumerate(COLUMNS)}
        conv = old_meta["step_convergence"]
        new_values, new_conv = compute(args.update)
        results.update(new_values)
        conv.update(new_conv)
        previous_timing = old_meta.get("timing", {})
    else:
        base = ln_pk({})
        print(f"fiducial ln P range {base.min():.3f}..{base.max():.3f}", flush=True)
        results, conv = compute(COLUMNS)
        previous_timing = {}
    fa = fa_check("omega_cdm")
    results = {p: (None, None, results[p]) for p in COLUMNS}   # shape used below

    # sanity: exact analytic derivatives
    sanity = {
        "max_abs_dlnP_dlnAs_minus_1": float(np.max(np.abs(results["ln10^{10}A_s"][2] - 1))),
        "max_abs_dlnP_dns_minus_ln(k/k_pivot)":
            float(np.max(np.abs(results["n_s"][2] - np.log(K / FIDUCIAL["k_pivot"])))),
        # smoothness: largest second difference in ln k of each column (60 log-spaced points)
        "max_abs_second_difference": {p: float(np.max(np.abs(np.diff(results[p][2], 2))))
                                      for p in COLUMNS},
    }

    cols = np.column_stack([K] + [results[p][2] for p in COLUMNS])
    header = "\n".join([
        f"CLASS {classy.__version__}: d ln P_m(k, z=0) / d theta at fixed k in 1/Mpc (P in Mpc^3), "
        "see class_dlnpk_dtheta.yaml",
        "fiducial: massive-nu LCDM of params.yaml, dark energy = CPL fluid w0=-1, wa=0, cs2=1, no PPF; "
        "5-point central differences; m_ncdm column without CLASS's ncdm fluid approximation",
        "k grid: k = 0.6736 * logspace(-3, 0, 60) [1/Mpc] (1e-3..1 h/Mpc at the fiducial h)",
        ",".join(["k_1/Mpc"] + COLUMNS)])
    np.savetxt(csv_path, cols, delimiter=",", fmt="%.9e", header=header,
               comments="# ")
    meta = {
        "description": "CLASS finite-difference derivatives d ln P_m(k, z=0)/d theta at fixed k in "
                       "1/Mpc, for gradient tests. Made by generate_class_derivatives.py.",
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "codes": {"classy": classy.__version__, "numpy": np.__version__,
                  "python": platform.python_version()},
        "units": {"k": "1/Mpc (no h)", "P": "Mpc^3 (no h)", "z": 0.0,
                  "m_ncdm": "eV", "derivative": "d ln P per unit of the parameter"},
        "fiducial": {**{k: float(v) for k, v in FIDUCIAL.items()}, "w0_fld": W0, "wa_fld": WA,
                     "cs2_fld": 1.0, "use_ppf": "no", "T_ncdm": "CLASS default 0.71611",
                     "A_s": 2.1e-9},
        "dark_energy_note": (
            "CLASS with use_ppf = no refuses a fluid with (1 + w_ini)(1 + w_0) <= 0, so w = -1 "
            "exactly cannot run as a fluid. The fiducial and the eight non-dark-energy steps use "
            "Omega_Lambda (a w = -1 fluid is exactly a cosmological constant: same background, "
            "zero perturbations). d/dw0: steps in w0 at wa = 0 (constant w). d/dwa = D_(1,1) - "
            "d/dw0 with D_(1,1) the derivative along (w0, wa) = (-1 + s, s); independent check "
            "2 d/dw0 - D_(2,-1) along (-1 + 2s, -s) (difference recorded under step_convergence)."),
        "class_output": OUTPUT,
        "class_precision": PRECISION,
        "k_grid": "0.6736 * logspace(-3, 0, 60) [1/Mpc]; P from classy pk_lin (CLASS's own "
                  "k-sampling and spline)",
        "stencil": "central differences D(s) = (f(+s) - f(-s)) / 2s and D(s/2); reported value = "
                   "(4 D(s/2) - D(s)) / 3 (5-point stencil on +-s/2, +-s)",
        "steps_absolute": {p: float(v) for p, v in STEPS.items()},
        "column_extra_precision": {p: v for p, v in COLUMN_PRECISION.items()},
        "ncdm_fluid_approximation_check": fa,
        "wa_direction_steps": {"(1,1)": float(STEPS["wa_fld"]), "(2,-1)": float(STEPS["wa_fld"] / 2)},
        "step_convergence": conv,
        "sanity": sanity,
        "fiducial_sigma8_note": "not computed here; see params.yaml class_massive (Lambda)",
        "columns": ["k_1/Mpc"] + COLUMNS,
        "timing": {"class_runs": _CALLS["n"], "class_wall_s": round(_CALLS["wall"], 1),
                   "class_cpu_s": round(_CALLS["cpu"], 1),
                   "script_wall_s": round(time.perf_counter() - t_start, 1),
                   **({"updated_columns": args.update, "before_update": previous_timing}
                      if args.update else {})},
    }
    try:
        import yaml
        text = yaml.safe_dump(meta, sort_keys=False, default_flow_style=None, width=110)
    except ImportError:
        text = json.dumps(meta, indent=1)
    yaml_path.write_text(text)
    print(json.dumps({"step_convergence": conv, "sanity": sanity}, default=str, indent=1))
    print(f"{_CALLS['n']} CLASS runs, {_CALLS['wall']:.0f} s wall; ncdm FA check {fa}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
