#!/usr/bin/env python
"""What the order of a GPU launch's trajectories costs, by a model: list scheduling of the
modes' step counts onto the blocks the GPU holds at once.

The GPU starts a launch's blocks about in index order, each as a slot frees; a launch of more
blocks than it holds at once ends when the last slot's work does. This script takes the step
counts (accepted + rejected) of one cosmology's modes from a JAX-backend run of a config,
replicates them over C cosmologies with a small spread (a ±5 % ensemble changes them by a few
per cent), and schedules them onto S slots in ascending k (the longest modes last) and in
descending k (``boltzmann.modes.solve_order``'s one-launch order). It prints each makespan in
step times and the lower bound max(total / S, longest). A model: every step of every warp is
taken to cost the same, which a GPU does not promise (warps on one SM share it).

    python scripts/launch_order_model.py --config lcdm --cosmologies 256 --slots 1056 2112
"""
from __future__ import annotations

import argparse
import heapq
import os
import sys

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def makespan(steps: np.ndarray, slots: int) -> float:
    """The end of the last block when ``steps`` (in launch order) start as slots free."""
    free = [0.0] * slots
    end = 0.0
    for s in steps:
        t = heapq.heappop(free) + float(s)
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--cosmologies", type=int, default=256)
    ap.add_argument("--slots", type=int, nargs="+", default=[1056, 2112],
                    help="blocks resident at once (132 SMs x 8 one-warp blocks at 255 "
                         "registers a lane = 1056)")
    ap.add_argument("--spread", type=float, default=0.03,
                    help="relative spread of a mode's steps across cosmologies")
    args = ap.parse_args(argv)
    from boltzmann import modes, pipeline
    from boltzmann.params import load_config
    from boltzmann.runtime import configure

    configure()
    res = pipeline.run(load_config(args.config), backend="jax")
    tr = res.transfers
    steps = (np.asarray(tr.n_accepted) + np.asarray(tr.n_rejected))[0].astype(float)
    rng = np.random.default_rng(0)
    C = args.cosmologies
    all_steps = np.concatenate([steps * (1 + args.spread * rng.standard_normal(steps.size))
                                for _ in range(C)])
    k = np.tile(tr.k[0], (C, 1))
    print(f"{args.config}: {steps.size} modes, steps median {np.median(steps):.0f}, max "
          f"{steps.max():.0f}; {C} cosmologies")
    print("| blocks at once | ascending k | highest k first | ratio | lower bound |")
    print("|---|---|---|---|---|")
    for S in args.slots:
        asc = makespan(all_steps[modes.solve_order(k, False)], S)
        desc = makespan(all_steps[modes.solve_order(k, True)], S)
        bound = max(all_steps.sum() / S, all_steps.max())
        print(f"| {S} | {asc:.0f} | {desc:.0f} | {asc / desc:.3f} | {bound:.0f} |")


if __name__ == "__main__":
    main()
