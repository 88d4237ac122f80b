#!/usr/bin/env python
"""The sparse solve grid above k_solve_dense_below, measured: P and σ8 against every mode solved.

Runs ``run_ensemble`` (JAX backend) on the config's fiducial and the corners of a prior box
(h, omega_b, omega_cdm, n_s at both ends, in all 16 combinations, and the neutrino mass at the
config's and at ``--m-ncdm-high`` alternately, a half fraction of the 32 corners), once per
``precision.k_solve_stride``, and prints a markdown table against the first stride given
(normally 1): the largest |P/P_ref − 1| over every k, redshift and cosmology for P_m and P_cb
(and at the solved modes alone, which should be 0: the same modes solved alike), the largest
|σ8/σ8_ref − 1|, the modes solved and the solver steps (accepted + rejected) of the fiducial
and of the whole ensemble, and the perturbation stage's seconds for the fiducial alone, warm
(the second of two calls: the ensemble's first call would include its compile). With
``--gradients CONFIG`` it also compares ``PowerSpectrumFunction.dlnpk`` (P_m and ∂ln P_m/∂θ)
at the strides.

    python scripts/k_stride_accuracy.py --config lcdm --strides 1 2 4 --dense-below 1.0
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

#: the prior box's corners: (low, high) per parameter
BOX = {"h": (0.60, 0.80), "omega_b": (0.019, 0.026), "omega_cdm": (0.09, 0.15),
       "n_s": (0.90, 1.03)}


def corner_cosmologies(fid, m_high: float) -> list:
    """The fiducial, then the 16 corners of BOX; with massive neutrinos every other corner
    (by the parity of its high ends) at ``m_high`` eV on every species."""
    out = [fid]
    massive = int(fid.n_ncdm) > 0
    for ends in itertools.product((0, 1), repeat=len(BOX)):
        changes = {name: BOX[name][e] for name, e in zip(BOX, ends)}
        if massive and sum(ends) % 2:
            changes["m_ncdm"] = np.full(np.shape(fid.m_ncdm), m_high)
        out.append(dataclasses.replace(fid, **changes))
    return out


def with_stride(cfg, stride: int, dense_below: float):
    precision = dataclasses.replace(cfg.precision, k_solve_stride=int(stride),
                                    k_solve_dense_below=float(dense_below))
    return dataclasses.replace(cfg, precision=precision)


def steps_of(result, c=None) -> int:
    tr = result.transfers
    steps = np.asarray(tr.n_accepted) + np.asarray(tr.n_rejected)
    return int(steps.sum() if c is None else steps[c].sum())


def compare_gradients(config: str, strides, dense_below: float, parameters) -> None:
    """∂ln P_m/∂θ of PowerSpectrumFunction at each stride against the first (one process)."""
    from boltzmann.gradients import PowerSpectrumFunction
    from boltzmann.params import load_config

    cfg = load_config(config)
    ref = None
    print(f"\n# {config}: PowerSpectrumFunction.dlnpk, parameters {parameters}")
    print("| stride | modes solved | max \\|P_m/P_ref − 1\\| | max \\|dlnP_m − ref\\| / "
          "max \\|ref\\| per parameter | seconds |")
    print("|---|---|---|---|---|")
    for stride in strides:
        fn = PowerSpectrumFunction(with_stride(cfg, stride, dense_below), parameters=parameters,
                                   backend="jax")
        d = fn.dlnpk()
        if ref is None:
            ref = d
        dp = np.abs(d["P_m"] / ref["P_m"] - 1).max()
        scale = np.abs(ref["dlnP_m"]).max(axis=(0, 1))
        dd = np.abs(d["dlnP_m"] - ref["dlnP_m"]).max(axis=(0, 1)) / scale
        print(f"| {stride} | {fn.k_solve.size} / {fn.k_axis.size} | {dp:.1e} | "
              + ", ".join(f"{n} {v:.1e}" for n, v in zip(fn.parameters, dd))
              + f" | {d['seconds']:.1f} |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--strides", type=int, nargs="+", default=[1, 2, 4],
                    help="k_solve_stride values; the first is the reference")
    ap.add_argument("--dense-below", type=float, default=1.0,
                    help="k_solve_dense_below [h/Mpc]")
    ap.add_argument("--m-ncdm-high", type=float, default=0.3,
                    help="neutrino mass [eV] of half the corners (massive configs)")
    ap.add_argument("--fiducial-only", action="store_true", help="no corners")
    ap.add_argument("--gradients", default=None, metavar="CONFIG",
                    help="also compare PowerSpectrumFunction's dlnP_m on this (small) config")
    ap.add_argument("--parameters", nargs="+", default=["omega_cdm", "h", "n_s"])
    args = ap.parse_args(argv)

    from boltzmann.ensemble import run_ensemble
    from boltzmann.params import load_config
    from boltzmann.runtime import configure

    configure()
    cfg = load_config(args.config)
    cosmologies = ([cfg.cosmology] if args.fiducial_only
                   else corner_cosmologies(cfg.cosmology, args.m_ncdm_high))
    print(f"# {args.config}: {len(cosmologies)} cosmologies (fiducial first), "
          f"k_solve_dense_below = {args.dense_below:g} h/Mpc, JAX backend")
    runs, warm = {}, {}
    for stride in args.strides:
        c = with_stride(cfg, stride, args.dense_below)
        run_ensemble(cosmologies[:1], c.precision, c.output, backend="jax")   # compiles
        warm[stride] = run_ensemble(cosmologies[:1], c.precision, c.output,
                                    backend="jax").timings["perturbations"]
        runs[stride] = run_ensemble(cosmologies, c.precision, c.output, backend="jax")
    ref = runs[args.strides[0]]
    print("| stride | P_m: max \\|P/P_ref − 1\\| (fiducial / all) | P_cb (fiducial / all) | "
          "at the solved modes | σ8, σ8_cb: max \\|Δσ/σ\\| (all) | modes solved | "
          "steps, fiducial | steps, all | perturbations, fiducial warm [s] |")
    print("|---|---|---|---|---|---|---|---|---|")
    base_steps = steps_of(ref, 0), steps_of(ref)
    for stride, r in runs.items():
        assert not r.failures(), r.failure_message()
        em = np.abs(r.spectra.pk_m / ref.spectra.pk_m - 1)
        ec = np.abs(r.spectra.pk_cb / ref.spectra.pk_cb - 1)
        solved = np.isin(ref.transfers.k[0], r.transfers.k[0])
        at_solved = max(em[..., solved].max(), ec[..., solved].max())
        es = max(np.abs(r.spectra.sigma8 / ref.spectra.sigma8 - 1).max(),
                 np.abs(r.spectra.sigma8_cb / ref.spectra.sigma8_cb - 1).max())
        s0, s_all = steps_of(r, 0), steps_of(r)
        print(f"| {stride} | {em[0].max():.1e} / {em.max():.1e} | {ec[0].max():.1e} / "
              f"{ec.max():.1e} | {at_solved:.1e} | {es:.1e} | {r.transfers.k.shape[1]} / "
              f"{r.k.shape[1]} | {s0} ({1 - s0 / base_steps[0]:.1%} fewer) | {s_all} "
              f"({1 - s_all / base_steps[1]:.1%} fewer) | {warm[stride]:.2f} |",
              flush=True)
    worst = np.unravel_index(np.argmax(np.abs(runs[args.strides[-1]].spectra.pk_m
                                              / ref.spectra.pk_m - 1)), ref.spectra.pk_m.shape)
    c, iz, ik = worst
    print(f"stride {args.strides[-1]}: worst P_m at cosmology {c} "
          f"({ {n: float(getattr(cosmologies[c], n)) for n in BOX} }, m_ncdm "
          f"{np.asarray(cosmologies[c].m_ncdm).tolist()}), z = {ref.z[iz]:g}, "
          f"k = {ref.k[c, ik]:.4g} 1/Mpc")
    if args.gradients:
        compare_gradients(args.gradients, args.strides, args.dense_below, args.parameters)


if __name__ == "__main__":
    main()
