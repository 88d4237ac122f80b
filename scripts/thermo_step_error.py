#!/usr/bin/env python
"""The recombination tables' step error: x_e and the visibility with Radau steps over 1, 2, 3 …
table cells below z = 3000 (``thermodynamics.thermodynamics_from_hubble``'s ``ode_stride``)
against a grid ``--refine`` times finer with a step per node, at the shared nodes.

    python scripts/thermo_step_error.py [--config lcdm] [--strides 1,2,3] [--refine 4]

Prints, per stride, the largest |difference| over 1 < z < 5000 of x_e and of the visibility
(each over its peak) and the change of z_rec, z_star and z_drag: the numbers behind
``precision.thermo_ode_step`` (docs/thermodynamics.md, "Steps over several nodes").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from boltzmann import modes  # noqa: E402
from boltzmann.params import load_config  # noqa: E402
from boltzmann.runtime import configure  # noqa: E402
from boltzmann.thermodynamics import compute_thermodynamics  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--strides", default="1,2,3")
    ap.add_argument("--refine", type=int, default=4)
    args = ap.parse_args(argv)
    configure()
    cfg = load_config(args.config)
    x = modes.make_grid(cfg.precision).nodes
    r = int(args.refine)
    fine = compute_thermodynamics(cfg.cosmology,
                                  lna_grid=np.linspace(x[0], x[-1], r * (len(x) - 1) + 1))
    z = np.expm1(-x)
    sel = (z > 1.0) & (z < 5000.0)
    print(f"{args.config}: {len(x)} nodes against {r * (len(x) - 1) + 1}")
    for stride in (int(s) for s in args.strides.split(",")):
        t = compute_thermodynamics(cfg.cosmology, lna_grid=x, ode_stride=stride)
        errs = []
        for name in ("x_e", "visibility"):
            ref = np.asarray(getattr(fine, name))[::r][sel]
            errs.append(np.abs(np.asarray(getattr(t, name))[sel] - ref).max() / np.abs(ref).max())
        dz = {n: float(getattr(t, n) - getattr(fine, n)) for n in ("z_rec", "z_star", "z_drag")}
        print(f"stride {stride}: x_e {errs[0]:.1e}, visibility {errs[1]:.1e} of their peaks; "
              + ", ".join(f"{n} {v:+.1e}" for n, v in dz.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
