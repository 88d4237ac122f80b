#!/usr/bin/env python
"""Which perturbation states the CMB line-of-sight sources read, at a given cosmology.

The C_ℓ Jacobian on the CUDA backend moves the sensitivity kernel's tangents of every state at
every source sample to the host and back (docs/solver.md); only the states the sources read
matter for the C_ℓ. This script takes the jvp of the source program along each state's unit
vector (all modes of a spread of k, all samples at once, random states) and lists the states
for which any source moves. A coefficient that vanishes at the chosen cosmology hides its state
(e.g. a dark-energy fluid at w = −1), so run it at more than one point (``--at``).

    python scripts/source_state_reads.py [--config configs/planck_cl.yaml]
        [--at w0_fld=-0.9 --at wa_fld=0.1] [--modes 12]
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from boltzmann import runtime
from boltzmann.cmb.gradients import ClFunction
from boltzmann.cmb.sources import evaluate_sources
from boltzmann.params import load_config


def states_read(f: ClFunction, theta, n_modes: int, seed: int = 0) -> list[int]:
    """Indices of the states whose unit tangent moves some source of ``n_modes`` modes spread
    over the plan's k, at parameters ``theta``."""
    table, rows, _, bg, _ = f._inputs(jnp.asarray(theta))
    K, S, n = f.plan.k.size, f.plan.x.size, f.model.n
    sel = np.unique(np.linspace(0, K - 1, n_modes).astype(int))
    ys = jnp.asarray(np.random.default_rng(seed).normal(size=(sel.size, S, n)))

    def sources(y):
        return evaluate_sources(f._program, y, f.plan.x, rows[sel], table, bg,
                                f.plan.streaming[sel])

    read = []
    for j in range(n):
        e = jnp.zeros_like(ys).at[:, :, j].set(1.0)
        _, t = jax.jvp(sources, (ys,), (e,))
        if any(float(jnp.max(jnp.abs(x))) > 0.0 for x in t):
            read.append(j)
    return read


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/planck_cl.yaml")
    ap.add_argument("--at", action="append", default=[], metavar="NAME=VALUE",
                    help="a parameter of the C_ℓ function moved from the config's value")
    ap.add_argument("--modes", type=int, default=12, help="modes spread over the plan's k")
    args = ap.parse_args(argv)
    runtime.configure(runtime.Settings(cache_root=None))
    f = ClFunction(load_config(args.config), backend="jax")
    theta = np.array(f.theta0, dtype=float)
    for item in args.at:
        name, _, value = item.partition("=")
        if name not in f.parameters or not value:
            ap.error(f"--at {item!r}: give NAME=VALUE with NAME one of {', '.join(f.parameters)}")
        theta[f.parameters.index(name)] = float(value)
    read = states_read(f, theta, args.modes)
    names = [f.model.state_names[j] for j in read]
    point = ", ".join(args.at) or "the config's parameters"
    print(f"{args.config} at {point}: the sources read {len(read)} of {f.model.n} states")
    print(", ".join(map(str, names)))


if __name__ == "__main__":
    main()
