#!/usr/bin/env python
"""Kernel variants side by side in one process: the warp kernel against the thread kernel, the
declared Jacobian against colour sweeps, the thread kernel's rolled stage loop against the
unrolled stages, and the baryons' error weight (precision ``baryon_error_weight``; the same
kernel, the weights are its arguments).

The EB rhs declares its Jacobian (``rhs.linear_jacobian``, derived from the linear source by
models/linear_jacobian.py); the solver then evaluates J's entries directly and sweeps only in t.
This script runs the same ΛCDM ensemble twice through the stage entries (tables → perturbations →
spectra), once with the model as it is ("direct") and once with an rhs that hides the declaration
("colored": one forward sweep per colour of the pattern, plus the t sweep), and prints for each:
the first call (compilation included), the warm wall time (median of ``--repeats``), the solve's
share, steps per mode, and the largest relative P(k) difference between the two.

    python scripts/bench_jacobian_kinds.py --backend cuda --cosmologies 1 256 --out DIR
    python scripts/bench_jacobian_kinds.py --backend cuda --variants direct,unrolled --out DIR
    python scripts/bench_jacobian_kinds.py --backend jax --cosmologies 1 --k-per-decade 4  # CPU
    python scripts/bench_jacobian_kinds.py --backend cuda --variants bw=1,bw=0.1 --out DIR
    python scripts/bench_jacobian_kinds.py --backend cuda --variants warp,thread --out DIR
    python scripts/bench_jacobian_kinds.py --backend cuda --variants direct,ascending --out DIR

A variant ``KEY=VALUE`` is the model as it is ("direct") with the precision key KEY set to VALUE
(``bw=W``: ``baryon_error_weight`` = W; ``ur_fluid_k_tau=30``: the massless neutrinos as a fluid
from k τ = 30, a second launch of the smaller model);
``ascending`` is the model as it is with its modes launched in ascending k (the longest last;
the code launches the highest k first, ``modes.solve_order``); ``warp`` and ``thread`` are the
model as it is on ``CudaBackend(kernel="warp" | "thread")``
(``direct`` and the other variants use the backend's default, the warp kernel for this model).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("JAX_ENABLE_X64", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from boltzmann import modes  # noqa: E402
from boltzmann.ensemble import fiducial_ensemble, stack_cosmologies  # noqa: E402
from boltzmann.params import ConfigError, load_config, with_precision  # noqa: E402
from boltzmann.perturbations import compute_perturbations  # noqa: E402
from boltzmann.runtime import Settings, backend_for, configure  # noqa: E402
from boltzmann.spectra import compute_spectra  # noqa: E402
from boltzmann.tables import compute_tables  # noqa: E402


def colored(model):
    """The same model with an rhs that does not declare its Jacobian (the table split stays, so
    the CUDA backend can still read the tables)."""
    inner = model.rhs

    def rhs(y, x, p, tab):
        return inner(y, x, p, tab)

    rhs.table_split = inner.table_split
    return dataclasses.replace(model, rhs=rhs)


def distinct(model):
    """The same model (declared Jacobian kept) under an rhs object of its own, so that the CUDA
    backend builds and caches a separate plan for it."""
    inner = model.rhs

    def rhs(y, x, p, tab):
        return inner(y, x, p, tab)

    for name in ("table_split", "linear_jacobian"):
        if hasattr(inner, name):
            setattr(rhs, name, getattr(inner, name))
    return dataclasses.replace(model, rhs=rhs)


@contextlib.contextmanager
def kernel_stages(rolled: bool):
    """CUDA plans built inside get ``KernelSpec.rolled_stages = rolled`` (a benchmark switch: the
    code's default is the spec's)."""
    from solver.backends.cuda import plan as cuda_plan
    build = cuda_plan.build_spec

    def patched(*a, **kw):
        return dataclasses.replace(build(*a, **kw), rolled_stages=rolled)

    cuda_plan.build_spec = patched
    try:
        yield
    finally:
        cuda_plan.build_spec = build


@contextlib.contextmanager
def ascending_launch():
    """Modes launched in ascending k, the longest last (``modes.solve_order``'s chunk order; the
    code's one launch takes the highest k first)."""
    order = modes.solve_order
    modes.solve_order = lambda k, one_launch: order(k, False)
    try:
        yield
    finally:
        modes.solve_order = order


def _stages(kind):
    if kind == "unrolled":
        return kernel_stages(False)
    return ascending_launch() if kind == "ascending" else contextlib.nullcontext()


def variant_config(cfg, variant: str):
    """``cfg`` with the precision key of a ``KEY=VALUE`` variant (``bw``: baryon_error_weight),
    checked as a config file's would be."""
    key, _, value = variant.partition("=")
    try:
        return with_precision(cfg, **{{"bw": "baryon_error_weight"}.get(key, key): float(value)})
    except (ValueError, ConfigError) as exc:
        raise SystemExit(f"--variants {variant}: {exc}") from None


def run_stages(cosmologies, cfg, model, backend):
    stacked = stack_cosmologies(cosmologies)
    grid = modes.make_grid(cfg.precision)
    t0 = time.perf_counter()
    tables = compute_tables(stacked, grid, model)
    k = np.stack([np.asarray(cfg.output.k_grid(float(c.h)), np.float64) for c in cosmologies])
    k_h = cfg.output.k_grid(1.0) if cfg.output.k_values is None else None
    tr = compute_perturbations(tables, stacked, k, cfg.output.z, cfg.precision, model, k_h=k_h,
                               backend=backend)
    sp = compute_spectra(tr, stacked)
    return time.perf_counter() - t0, tr, sp


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lcdm")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "jax"))
    ap.add_argument("--cosmologies", type=int, nargs="+", default=[1, 256])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k-per-decade", type=int, default=None,
                    help="override the config's k sampling (a quick CPU run)")
    ap.add_argument("--variants", default="direct,colored",
                    help="comma-separated: direct, colored, unrolled (CUDA: stages unrolled), "
                         "ascending (direct, modes launched lowest k first), "
                         "KEY=VALUE (direct with a precision key changed; bw=W: "
                         "baryon_error_weight W)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    settings = Settings.from_environment()
    configure(settings)  # float64 and the persistent caches, as the CLI
    backend = backend_for(args.backend, settings)
    cfg = load_config(args.config)
    if args.k_per_decade:
        cfg = dataclasses.replace(cfg, output=dataclasses.replace(
            cfg.output, k_per_decade=args.k_per_decade))
    base = modes.model_for(cfg.cosmology, cfg.precision)
    known = {"direct": lambda: base, "colored": lambda: colored(base),
             "unrolled": lambda: distinct(base), "warp": lambda: base,
             "thread": lambda: distinct(base), "ascending": lambda: base}
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in known and "=" not in v]
    if bad:
        ap.error(f"--variants: unknown {bad}; choose from {sorted(known)}")
    if {"unrolled", "warp", "thread"} & set(variants) and args.backend != "cuda":
        ap.error("--variants unrolled/warp/thread are CUDA kernel variants: use --backend cuda")
    backends = {v: backend_for(args.backend, settings, kernel=v) if v in ("warp", "thread")
                else backend for v in variants}
    models = {v: known[v]() if v in known else
              modes.model_for(cfg.cosmology, variant_config(cfg, v).precision) for v in variants}
    configs = {v: variant_config(cfg, v) if "=" in v else cfg for v in variants}
    machine = os.environ.get("BENCH_MACHINE", platform.node())
    date = datetime.date.today().isoformat()
    command = "python scripts/bench_jacobian_kinds.py " + " ".join(argv or sys.argv[1:])
    rows, pk = [], {}
    for kind, model in models.items():
        for C in args.cosmologies:
            cosmos = fiducial_ensemble(C, cfg)
            with _stages(kind):
                first, _, _ = run_stages(cosmos, configs[kind], model, backends[kind])
            walls, solves = [], []
            for _ in range(args.repeats):
                with _stages(kind):
                    wall, tr, sp = run_stages(cosmos, configs[kind], model, backends[kind])
                walls.append(wall)
                solves.append(tr.timings["solve"])
            pk[(kind, C)] = np.asarray(sp.pk_m)
            steps = np.asarray(tr.n_accepted)
            row = {"kind": kind, "cosmologies": C, "first_s": first,
                   "warm_s": statistics.median(walls), "solve_s": statistics.median(solves),
                   "steps_median": float(np.median(steps)), "steps_max": int(steps.max()),
                   "jacobian": tr.solver_info.get("jacobian"),
                   "kernel": tr.solver_info.get("kernel"), "failed": int(np.sum(
                       np.asarray(tr.status) != 0))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = [f"Machine: {machine}; date {date}; command `{command}`; backend {args.backend}.", "",
             "| variant (Jacobian) | cosmologies | first call [s] | warm [s] | solve [s] | steps median / max"
             f" | failed modes | max \\|P_m ratio − 1\\| vs {variants[0]} |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ref = pk[(variants[0], r["cosmologies"])]
        diff = float(np.nanmax(np.abs(pk[(r["kind"], r["cosmologies"])] / ref - 1.0)))
        lines.append(f"| {r['kind']} ({r['jacobian']}) | {r['cosmologies']} | {r['first_s']:.1f} "
                     f"| {r['warm_s']:.3f} | {r['solve_s']:.3f} | {r['steps_median']:.0f} / "
                     f"{r['steps_max']} | {r['failed']} | {diff:.1e} |")
    table = "\n".join(lines)
    print(table)
    write_outputs(args.out, "jacobian_kinds", {"machine": machine, "date": date,
                                               "command": command, "rows": rows}, table)


def write_outputs(out, stem: str, record: dict, table: str) -> None:
    """``OUT/stem.json`` (the rows with machine, date and command) and ``OUT/stem.md`` (the
    table); nothing without ``out``."""
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
