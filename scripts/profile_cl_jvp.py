#!/usr/bin/env python
"""Where the C_ℓ Jacobian's spectra stage spends its time: ``ClFunction``'s program after the
sources (line of sight, k integral, Limber, ℓ spline, lensing), its value against its jvp along
the solve's directions, part by part, on one device.

The sources are synthetic (smooth, of the right shapes: the cost of these programs does not
depend on their values), their tangents random; the background, the primordial parameters and
their tangents are the fiducial cosmology's. Each part is a compiled program of its own, timed
warm (the best of ``--repeat``, after a first call that compiles):

- ``transfers``: the line of sight (sources → Δ_ℓ^T, Δ_ℓ^E, Δ_ℓ^φ);
- ``after``: transfer functions → the outputs (k integral, Limber, ℓ spline, lensing);
- ``spectra``: both, as ``ClFunction`` runs them (``_spectra``, ``_spectra_jvp``).

Prints a Markdown table: the part, its value's seconds, its jvp's and their ratio.

    python scripts/profile_cl_jvp.py [--config configs/planck_cl.yaml] [--repeat 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np


def best(fn, args, repeat):
    """(seconds of the first call, best warm seconds) of ``fn(*args)``."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return first, min(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/planck_cl.yaml")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--parts", default="transfers,after,spectra")
    args = ap.parse_args(argv)

    from boltzmann import runtime
    from boltzmann.cmb.gradients import ClFunction
    from boltzmann.params import load_config

    runtime.configure(runtime.Settings.from_environment())
    f = ClFunction(load_config(args.config))
    (_, _, _, bg, prim), (_, _, _, dbg, dprim) = jax.block_until_ready(
        f._host_inputs(f._jit_inputs_jvp, f.theta0))
    S = f._map.solve_directions
    K, X = f.plan.k.size, f.plan.x.size
    rng = np.random.default_rng(1)
    shape = np.exp(-((np.log(f.plan.k)[:, None] + 3.0) ** 2)) * np.ones((1, X))
    srcs = tuple(jnp.asarray(shape * (1.0 + 0.1 * i)) for i in range(5))
    dsrcs = tuple(jnp.asarray(rng.normal(size=(S.size, K, X)) * shape) for _ in range(5))
    ta = f._table_args
    print(f"# {jax.devices()[0].device_kind}: {K} modes x {X} samples, {S.size} solve "
          f"directions, {len(f.ells)} sampled multipoles, l_max {f.l_max}", flush=True)

    # the tables (the Bessel table, GB) are arguments of every program, never its constants
    def tr_value(s, g, t):
        tr = f._transfers(s, g, t)
        return tr.T, tr.E, tr.P

    def tr_jvp(s, g, ds, dg, t):
        return jax.vmap(lambda a, b: jax.jvp(lambda s_, g_: tr_value(s_, g_, t), (s, g),
                                             (a, b)), out_axes=(None, 0))(ds, dg)

    rows_out = []
    parts = args.parts.split(",")
    if "transfers" in parts or "after" in parts:
        tr = f._transfers(srcs, bg, ta)
    if "transfers" in parts:
        v = best(jax.jit(tr_value), (srcs, bg, ta), args.repeat)
        d = best(jax.jit(tr_jvp), (srcs, bg, dsrcs, dbg, ta), args.repeat)
        rows_out.append(("transfers", v, d))
    if "after" in parts:
        def after(T, E, P, s, g, p, t):
            return f._from_transfers(dataclasses.replace(tr, T=T, E=E, P=P), s, g, p, t)

        dT = jnp.asarray(rng.normal(size=(S.size,) + tr.T.shape))
        dE = jnp.asarray(rng.normal(size=(S.size,) + tr.E.shape))
        dP = jnp.asarray(rng.normal(size=(S.size,) + tr.P.shape)) if tr.P is not None else None
        dp = jax.tree_util.tree_map(lambda t: t[S], dprim)

        def after_jvp(T, E, P, s, g, p, dT, dE, dP, ds, dg, dp, t):
            return jax.vmap(lambda *d: jax.jvp(lambda *a: after(*a, t), (T, E, P, s, g, p), d),
                            out_axes=(None, 0))(dT, dE, dP, ds, dg, dp)

        v = best(jax.jit(after), (tr.T, tr.E, tr.P, srcs, bg, prim, ta), args.repeat)
        d = best(jax.jit(after_jvp), (tr.T, tr.E, tr.P, srcs, bg, prim, dT, dE, dP, dsrcs,
                                      dbg, dp, ta), args.repeat)
        rows_out.append(("after", v, d))
    if "spectra" in parts:
        v = best(f._jit_spectra, (srcs, bg, prim, ta), args.repeat)
        d = best(f._jit_spectra_jvp, (srcs, bg, prim, dsrcs, dbg, dprim, ta), args.repeat)
        rows_out.append(("spectra", v, d))

    print("| part | value first s | value warm s | jvp first s | jvp warm s | jvp/value |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (v0, v), (d0, d) in rows_out:
        print(f"| {name} | {v0:.2f} | {v:.4f} | {d0:.2f} | {d:.4f} | {d / v:.2f} |")


if __name__ == "__main__":
    main()
