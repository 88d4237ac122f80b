#!/usr/bin/env python
"""Generate the CLASS reference CMB spectra (class_cl.csv, class_cl.yaml).

Run:  python tests/data/generate_cl.py [--case CASE] [--quick]   (needs classy 3.4.1; the raised
      precision takes ~10 min on 2 cores for lcdm, longer with massive neutrinos)

Cases (--case):
  lcdm       the massless-neutrino Planck-2018-like LCDM of params.yaml (N_ur = 3.044, no ncdm)
             -> class_cl.csv, class_cl.yaml (with a HyRec run beside the RECFAST one);
  heavy_nu   configs/wcdm_heavy_nu.yaml: two 0.1 eV neutrinos and a w0 = -0.9, wa = 0.1 fluid
             (rest frame, no PPF) -> class_cl_wcdm_heavy_nu.csv/.yaml;
  desi_w0wa  configs/desi_w0wa.yaml: one 0.06 eV neutrino and the DESI DR2 w0 = -0.75,
             wa = -0.86 fluid with PPF -> class_cl_ppf_desi.csv/.yaml.
The config cases take their cosmology from the config through
boltzmann.class_reference.class_parameters (the CLI's --compare translation) and add NCDM below.
Recombination: CLASS's RECFAST 1.5.2 with photoionisation at the radiation temperature
(``recfast_photoion_dependence = Trad``), the model boltzmann.thermodynamics implements, so that
the comparison tests the CMB code and not the RECFAST-vs-HyRec difference (a HyRec run is made
too and its TT/EE differences are recorded in the YAML).  Reionisation: CLASS's default tanh.

--lensed-input L: one more high-precision run with l_max_scalars = L, so that CLASS
lenses the spectra to 2500 from unlensed ones to L + delta_l_max = L + 1000 (the main run stops at
3500, where lensed BB above l = 1500 and TT above 2000 are not converged: see docs/cmb.md,
Lensing) -> <stem>_lensed_l<L>.csv with the lensed columns only, and its .yaml.

Written (every l from 2 to 30, then every 10th to 2500):
  class_cl.csv   ell, unlensed TT, EE, TE [D_l = l(l+1)C_l/2pi, muK^2], PP [(l(l+1))^2 C_l/2pi],
                 lensed TT, EE, TE, BB [D_l, muK^2]
  class_cl.yaml  inputs, precision, CLASS version, derived numbers, timings, precision check
                 (high vs default precision) and HyRec-vs-RECFAST differences.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import classy
from classy import Class

OUT = Path(__file__).resolve().parent
T_CMB = 2.7255
COSMO = {"h": 0.6736, "omega_b": 0.02237, "omega_cdm": 0.12, "A_s": 2.1e-9, "n_s": 0.9649,
         "k_pivot": 0.05, "tau_reio": 0.0544, "YHe": 0.2454, "T_cmb": T_CMB, "N_ur": 3.044,
         "N_ncdm": 0}
OUTPUT = {"output": "tCl,pCl,lCl", "lensing": "yes", "l_max_scalars": 2500,
          "gauge": "synchronous"}
RECFAST = {"recombination": "RECFAST", "recfast_photoion_dependence": "Trad"}
#: raised precision: finer k and tau sampling of the sources, more multipoles, fewer
#: approximations, every l up to 2500 from a denser l sampling, accurate lensing
HIGH = {
    "tol_perturbations_integration": 1e-6, "perturbations_sampling_stepsize": 0.03,
    "k_step_sub": 0.015, "k_step_super": 0.0005, "k_max_tau0_over_l_max": 3.0,
    "q_linstep": 0.2, "l_linstep": 10, "l_logstep": 1.03, "hyper_sampling_flat": 16,
    "l_max_g": 40, "l_max_pol_g": 25, "l_max_ur": 50,
    "radiation_streaming_trigger_tau_over_tau_k": 240.0,
    "radiation_streaming_trigger_tau_c_over_tau": 100.0,
    "ur_fluid_trigger_tau_over_tau_k": 50.0,
    "tight_coupling_trigger_tau_c_over_tau_h": 0.005,
    "tight_coupling_trigger_tau_c_over_tau_k": 0.005,
    "start_sources_at_tau_c_over_tau_h": 0.004,
    "neglect_CMB_sources_below_visibility": 1e-6, "transfer_neglect_late_source": 3000.0,
    "transfer_neglect_delta_k_S_t0": 0.3, "transfer_neglect_delta_k_S_t1": 0.15,
    "transfer_neglect_delta_k_S_t2": 0.3, "transfer_neglect_delta_k_S_e": 0.3,
    "l_switch_limber": 100.0, "accurate_lensing": 1, "delta_l_max": 1000,
}
#: massive neutrinos: tighter momentum quadrature than CLASS's default (our model integrates
#: the full hierarchy to z = 0; CLASS keeps its default ncdm fluid approximation late, which
#: changes the C_l far below the tolerances and keeps the run to tens of minutes)
NCDM = {"tol_ncdm_synchronous": 1e-4, "tol_ncdm_bg": 1e-10, "l_max_ncdm": 30}
#: case -> (config file or None for COSMO, output stem)
CASES = {"lcdm": (None, "class_cl"),
         "heavy_nu": ("configs/wcdm_heavy_nu.yaml", "class_cl_wcdm_heavy_nu"),
         "desi_w0wa": ("configs/desi_w0wa.yaml", "class_cl_ppf_desi")}
ELLS = np.concatenate([np.arange(2, 30), np.arange(30, 2501, 10)])


def cosmology(case):
    """CLASS's cosmology input for ``case`` (no output, gauge or recombination keys)."""
    path = CASES[case][0]
    if path is None:
        return dict(COSMO)
    from boltzmann.class_reference import class_parameters
    from boltzmann.params import load_config

    c = class_parameters(load_config(OUT.parents[1] / path), pk=False, cl=False)
    drop = {"gauge", "recombination", "recfast_photoion_dependence", "output"}
    return {k: v for k, v in c.items() if k not in drop}


def run(settings, cosmo=COSMO, l_max_scalars=2500):
    M = Class()
    M.set({**cosmo, **OUTPUT, **settings, "l_max_scalars": int(l_max_scalars)})
    t0, c0 = time.perf_counter(), time.process_time()
    M.compute()
    timing = {"wall": round(time.perf_counter() - t0, 2), "cpu": round(time.process_time() - c0, 2)}
    raw, lensed = M.raw_cl(2500), M.lensed_cl(2500)
    derived = M.get_current_derived_parameters(["z_rec", "tau_rec", "z_star", "conformal_age",
                                                "z_reio", "100*theta_star"])
    M.struct_cleanup()
    return raw, lensed, timing, {k: float(v) for k, v in derived.items()}


def columns(raw, lensed):
    ell = ELLS.astype(float)
    f = ell * (ell + 1) / (2 * np.pi) * (T_CMB * 1e6) ** 2
    return {
        "ell": ELLS,
        "TT": f * raw["tt"][ELLS], "EE": f * raw["ee"][ELLS], "TE": f * raw["te"][ELLS],
        "PP": (ell * (ell + 1)) ** 2 / (2 * np.pi) * raw["pp"][ELLS],
        "TT_lensed": f * lensed["tt"][ELLS], "EE_lensed": f * lensed["ee"][ELLS],
        "TE_lensed": f * lensed["te"][ELLS], "BB_lensed": f * lensed["bb"][ELLS],
    }


def max_rel(a, b, names, lmin=30):
    sel = ELLS >= lmin
    return {n: float(np.max(np.abs(a[n][sel] / b[n][sel] - 1))) for n in names}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="default precision only (test)")
    parser.add_argument("--case", choices=sorted(CASES), default="lcdm")
    parser.add_argument("--lensed-input", type=int, default=None, metavar="L",
                        help="only the lensed columns, from a run with l_max_scalars = L")
    args = parser.parse_args()
    import yaml

    if args.lensed_input is not None:
        return lensed_only(args.case, int(args.lensed_input))

    cosmo = cosmology(args.case)
    ncdm = NCDM if int(cosmo.get("N_ncdm", 0)) else {}
    high = {} if args.quick else {**HIGH, **ncdm}
    raw, lensed, timing, derived = run({**RECFAST, **high}, cosmo)
    cols = columns(raw, lensed)
    stem = CASES[args.case][1]
    meta = {"description": __doc__.split("\n\n")[0], "case": args.case,
            "config": CASES[args.case][0], "classy": classy.__version__,
            "class_input": {**cosmo, **OUTPUT, **RECFAST}, "precision": high,
            "timing_s": {"reference": timing}, "derived": derived}
    if not args.quick:
        raw_d, lensed_d, timing_d, _ = run({**RECFAST, **ncdm}, cosmo)
        meta["timing_s"]["default_precision"] = timing_d
        names = ["TT", "EE", "PP", "TT_lensed", "EE_lensed", "BB_lensed"]
        meta["default_vs_reference_max_rel_l_ge_30"] = max_rel(columns(raw_d, lensed_d), cols, names)
        if args.case == "lcdm":
            raw_h, lensed_h, timing_h, _ = run(high, cosmo)
            meta["timing_s"]["hyrec"] = timing_h
            meta["hyrec_vs_recfast_max_rel_l_ge_30"] = max_rel(columns(raw_h, lensed_h), cols,
                                                               names)
    data = np.column_stack([np.asarray(cols[n], float) for n in cols])
    t_cmb = float(cosmo.get("T_cmb", T_CMB))
    header = (f"CLASS {classy.__version__} CMB spectra (generate_cl.py --case {args.case}, "
              f"{stem}.yaml): D_l = l(l+1)C_l/2pi in muK^2 (T_cmb = {t_cmb} K), "
              "PP = [l(l+1)]^2 C_l^phiphi/2pi\n"
              + ",".join(cols))
    np.savetxt(OUT / f"{stem}.csv", data, delimiter=",", header=header, comments="# ",
               fmt=["%d"] + ["%.10e"] * (len(cols) - 1))
    with open(OUT / f"{stem}.yaml", "w") as fh:
        yaml.safe_dump(meta, fh, sort_keys=False, width=100)
    print(yaml.safe_dump(meta, sort_keys=False, width=100))


def lensed_only(case: str, l_max_scalars: int):
    """The lensed columns from a high-precision run with ``l_max_scalars`` (the unlensed input
    of CLASS's lensing reaching l_max_scalars + delta_l_max)."""
    import yaml

    cosmo = cosmology(case)
    high = {**HIGH, **(NCDM if int(cosmo.get("N_ncdm", 0)) else {})}
    raw, lensed, timing, derived = run({**RECFAST, **high}, cosmo, l_max_scalars)
    cols = {k: v for k, v in columns(raw, lensed).items() if k == "ell" or k.endswith("lensed")}
    stem = f"{CASES[case][1]}_lensed_l{l_max_scalars}"
    meta = {"description": __doc__.split("\n\n")[0] + f" Lensed columns only, --lensed-input "
            f"{l_max_scalars}.", "case": case, "classy": classy.__version__,
            "class_input": {**cosmo, **OUTPUT, **RECFAST, "l_max_scalars": l_max_scalars},
            "precision": high, "timing_s": {"reference": timing}, "derived": derived}
    header = (f"CLASS {classy.__version__} lensed CMB spectra (generate_cl.py --case {case} "
              f"--lensed-input {l_max_scalars}, {stem}.yaml): D_l = l(l+1)C_l/2pi in muK^2, "
              f"lensed from unlensed spectra to l = {l_max_scalars + HIGH['delta_l_max']}\n"
              + ",".join(cols))
    data = np.column_stack([np.asarray(cols[n], float) for n in cols])
    np.savetxt(OUT / f"{stem}.csv", data, delimiter=",", header=header, comments="# ",
               fmt=["%d"] + ["%.10e"] * (len(cols) - 1))
    with open(OUT / f"{stem}.yaml", "w") as fh:
        yaml.safe_dump(meta, fh, sort_keys=False, width=100)
    print(yaml.safe_dump(meta, sort_keys=False, width=100))


if __name__ == "__main__":
    main()
