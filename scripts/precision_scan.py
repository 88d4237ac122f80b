"""P(k) and the perturbation solve's cost under precision variants, side by side in one process.

    python scripts/precision_scan.py --config lcdm --variants "" ur_fluid_k_tau=30 \
        "ur_fluid_k_tau=30+ncdm_fluid_k_tau=100" --reference tests/data/class_lcdm_pk.csv

Each variant is ``name=value`` settings of the precision block joined by ``+`` ("" = the config
as it is). Per variant: the warm solve time (median of ``--repeats`` runs after a first, compiling
one), the accepted steps (total, slowest mode), the size of each neutrino-fluid phase
(docs/perturbations.md), and max |P/P_first - 1| against the first variant and, with
``--reference``, against a CLASS P(k) file (tests/data layout) at z = 0, printed every few k.
With ``--jacobian``, also ``PowerSpectrumFunction(config).dlnpk()`` per variant (all parameters,
the config's own k grid and redshifts): first and warm seconds, and the largest change of each
parameter's ∂ln P_m/∂θ against the first variant's, over that parameter's largest |∂ln P_m/∂θ|.
With ``--cl``, the unlensed C_ℓ of the config (an output block with ``cl``, e.g. planck_cl)
instead of P(k): per variant the seconds of one ``cl_for_config`` and the largest change of each
spectrum against the first variant's in the ℓ ranges of the accuracy targets
(``boltzmann.cmb.convergence.max_changes``: TE over √(TT·EE)).

    python scripts/precision_scan.py --config planck_cl --cl --variants "" \
        thermo_ode_step=0.005 thermo_ode_step=0.0174
"""
from __future__ import annotations

import argparse
import time

import jax
import numpy as np
import yaml
from scipy.interpolate import CubicSpline

from boltzmann import pipeline
from boltzmann.output import read_pk_csv
from boltzmann.params import load_config
from boltzmann.schema import PRECISION_TABLE


def _variant(spec: str) -> dict:
    out = {}
    for item in filter(None, spec.split("+")):
        key, value = item.split("=")
        if key not in PRECISION_TABLE:
            raise SystemExit(f"unknown precision key {key!r}")
        out[key] = int(value) if PRECISION_TABLE[key].kind == "int" else float(value)
    return out


def _with_precision(name: str, settings: dict) -> dict:
    """configs/<name>.yaml as a mapping, its precision block updated by ``settings``."""
    data = yaml.safe_load(open(f"configs/{name}.yaml"))
    data["precision"] = {**(data.get("precision") or {}), **settings}
    return data


def _config(name: str, settings: dict, k_per_decade: float):
    data = _with_precision(name, settings)
    data["output"] = {**data["output"], "z": [0.0], "k_per_decade": k_per_decade}
    data["output"].pop("z_background", None)
    return load_config(data)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--variants", nargs="+", default=[""])
    ap.add_argument("--reference", help="CLASS P(k) file with a P_m_z0 column (tests/data)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--k-per-decade", type=float, default=10.0)
    ap.add_argument("--backend", default="jax")
    ap.add_argument("--cl", action="store_true",
                    help="compare the unlensed C_l of the config instead of P(k)")
    ap.add_argument("--jacobian", action="store_true",
                    help="also time PowerSpectrumFunction.dlnpk() and compare its derivatives")
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    if args.cl:
        return _cl_scan(args.config, args.variants, args.backend)
    ref = read_pk_csv(args.reference) if args.reference else None
    first, first_d = None, None
    for spec in args.variants:
        cfg = _config(args.config, _variant(spec), args.k_per_decade)
        pipeline.run(cfg, backend=args.backend)                        # compiles
        solves, res = [], None
        for _ in range(args.repeats):
            t = time.perf_counter()
            res = pipeline.run(cfg, backend=args.backend)
            solves.append(res.transfers.timings["solve"])
            _ = time.perf_counter() - t
        tr = res.transfers
        phases = {key: (v["modes"], v["state_size"]) for key, v in tr.solver_info.items()
                  if key.endswith("_phase")}
        k = np.asarray(res.spectra.k)[0]
        pk = np.asarray(res.spectra.pk_m)[0, 0]
        first = pk if first is None else first
        print(f"[{spec or 'as is'}] solve {np.median(solves):.3f} s (median of {len(solves)}), "
              f"n = {tr.solver_info['state_size']}, phases (modes, n) {phases}, steps "
              f"{int(tr.n_accepted.sum())} / slowest {int(tr.n_accepted.max())}, "
              f"failed {len(tr.failures())}; max |P_m/P_first - 1| {np.abs(pk / first - 1).max():.2e}")
        if args.jacobian:
            d, line = _jacobian(args.config, _variant(spec), first_d)
            first_d = d if first_d is None else first_d
            print(line, flush=True)
        if ref is not None:
            k_ref, cols = ref
            col = next(c for c in cols if c.startswith("P_m_z0_") or c == "P_m_z0")
            want = np.exp(CubicSpline(np.log(k_ref), np.log(cols[col]))(np.log(k)))
            rel = pk / want - 1
            print(f"    vs {args.reference}: max {np.abs(rel).max():.2e};  k [1/Mpc]: rel  "
                  + "  ".join(f"{a:.3g}: {b:+.1e}" for a, b in zip(k[::4], rel[::4])))


def _cl_scan(config_name: str, variants, backend: str) -> None:
    """The unlensed C_ℓ of each variant against the first (module docstring)."""
    from boltzmann.cmb import cl_for_config
    from boltzmann.cmb.convergence import RANGES, max_changes
    first = None
    for spec in variants:
        t = time.perf_counter()
        cl = cl_for_config(load_config(_with_precision(config_name, _variant(spec))),
                           lensing=False, backend=backend)
        seconds = time.perf_counter() - t
        first = cl if first is None else first
        changes = max_changes(first, cl)
        print(f"[{spec or 'as is'}] C_l in {seconds:.1f} s (first call, compiles included); max "
              "change against the first variant, by l range "
              + ", ".join(f"{lo}-{hi}" for lo, hi in RANGES) + ": "
              + "; ".join(f"{name} " + " ".join(f"{v:.1e}" for v in row)
                          for name, row in changes.items()), flush=True)


def _jacobian(config_name: str, settings: dict, first_d):
    """(dlnP_m, printed line) of PowerSpectrumFunction(config with ``settings``).dlnpk()."""
    from boltzmann.gradients import PowerSpectrumFunction
    fn = PowerSpectrumFunction(load_config(_with_precision(config_name, settings)))
    t = time.perf_counter()
    fn.dlnpk()
    first = time.perf_counter() - t
    t = time.perf_counter()
    d = np.asarray(fn.dlnpk()["dlnP_m"])
    warm = time.perf_counter() - t
    line = f"    dlnpk: first {first:.1f} s, warm {warm:.1f} s"
    if first_d is not None:
        change = np.max(np.abs(d - first_d), axis=(0, 1)) / np.max(np.abs(first_d), axis=(0, 1))
        line += "; change / scale " + ", ".join(f"{n} {v:.1e}" for n, v in
                                                 zip(fn.parameters, change))
    return d, line


if __name__ == "__main__":
    main()
