#!/usr/bin/env python
"""Time of the CMB spectra (``boltzmann.cmb.cl_for_config``) in one process, first and warm.

Runs the config's C_ℓ ``--runs`` times in this process (the first compiles; the later ones are
warm: compiled programs, CUDA kernel and the Bessel table kept) and prints a Markdown table with
the stage times of every run (tables = the rest of the call: background, thermodynamics, model
table). ``--class`` also times CLASS (classy) on the same request at its default precision, so
that the two can be compared on one machine; ``--out DIR`` writes ``bench_cl.json``.
``--los-batch 1,auto`` times the line of sight with one multipole per loop iteration, then
with ``line_of_sight.multipole_batch``'s number, side by side in this process.
``--gradients`` times ``boltzmann.cmb.ClFunction`` instead: its value and its Jacobian in the
``--parameters``, each ``--runs`` times (first and warm), and their ratio.

    python scripts/bench_cl.py --config configs/planck_cl.yaml --runs 3 --class
    python scripts/bench_cl.py --backend cuda --runs 4 --out OUT
    python scripts/bench_cl.py --backend cuda --runs 3 --los-batch 1,auto
    python scripts/bench_cl.py --gradients --parameters h omega_cdm tau_reio --l-max 60 \
        --lensing off --coarser 2 --runs 2
    python scripts/bench_cl.py --backend cuda --gradients --runs 3 --direction-block 2,9
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np

STAGES = ("tables", "sources", "bessel", "line_of_sight", "spectra", "lensing")


def device_name() -> str:
    import jax

    d = jax.devices()[0]
    return f"{d.platform}: {getattr(d, 'device_kind', '')}".strip()


def time_ours(config, backend: str, runs: int, los_batch: int | None = None) -> list[dict]:
    from boltzmann.cmb import cl_for_config

    rows = []
    for i in range(runs):
        t0 = time.perf_counter()
        res = cl_for_config(config, backend=backend, los_batch=los_batch)
        total = time.perf_counter() - t0
        stages = {name: float(res.timings.get(name, 0.0)) for name in STAGES[1:]}
        stages["tables"] = total - sum(stages.values())
        rows.append({"run": i + 1, "total_s": total, **{f"{k}_s": v for k, v in stages.items()},
                     "los_batch": "auto" if los_batch is None else int(los_batch),
                     "info": res.info})
        print(f"run {i + 1}: {total:.3f} s", {k: round(v, 3) for k, v in stages.items()},
              flush=True)
    return rows


def time_gradients(config, backend, runs: int, parameters, sampling, sec=None,
                   keep: dict | None = None, direction_block: int | None = None) -> dict:
    """First and warm wall times of ``ClFunction``'s value and Jacobian calls (``sec``: its
    ``sensitivity_error_control``, None for the default; ``direction_block`` likewise), with
    every Jacobian call's stage seconds; ``keep``, a dict, receives the last Jacobian's
    arrays."""
    import jax

    from boltzmann.cmb.gradients import ClFunction

    t0 = time.perf_counter()
    kw = {} if sec is None else {"sensitivity_error_control": sec}
    if direction_block is not None:
        kw["direction_block"] = int(direction_block)
    f = ClFunction(config, parameters=parameters, sampling=sampling, backend=backend, **kw)
    out = {"setup_s": time.perf_counter() - t0, "parameters": list(f.parameters),
           "modes": int(f.plan.k.size), "samples": int(f.plan.x.size), "value_s": [],
           "jacobian_s": [], "jacobian_stages_s": [], "sensitivity_launch": [],
           "direction_block": f.direction_block}
    for key, call in (("value_s", f), ("jacobian_s", f.jacobian)):
        for i in range(runs):
            t0 = time.perf_counter()
            res = jax.block_until_ready(call())
            out[key].append(time.perf_counter() - t0)
            if key == "jacobian_s":
                out["jacobian_stages_s"].append(dict(f.last_stage_seconds))
                out["sensitivity_launch"].append(_launch_seconds(f.backend))
                if keep is not None:
                    keep.update({f"d_{name}": np.asarray(v) for name, v in res[1].items()})
            print(f"{key[:-2]} {i + 1}: {out[key][-1]:.3f} s", flush=True)
    return out


#: what a CUDA sensitivity launch reports of its own cost (solver/backends/cuda: the kernel,
#: the copies to and from the device, the host callback around them, the bytes brought back)
_LAUNCH_KEYS = ("kernel_seconds", "copy_in_seconds", "copy_out_seconds", "callback_seconds",
                "output_bytes")


def _launch_seconds(backend) -> dict:
    """The last sensitivity launch's own timings (empty on a backend that has none): with the
    sources stage's seconds they split it into the kernel, the copies and the rest."""
    from solver.backends.registry import resolve_backend

    info = getattr(resolve_backend(backend), "last_sensitivity_info", None) or {}
    return {k: info[k] for k in _LAUNCH_KEYS if k in info}


def _launch_text(launch: dict) -> str:
    """``_launch_seconds``'s dict as the tail of a stage line ("" when empty)."""
    if not launch:
        return ""
    parts = [f"{v / 1e9:.2f} GB out" if k == "output_bytes"
             else f"{k.removesuffix('_seconds')} {v:.3f}" for k, v in launch.items()]
    return "; the sources' sensitivity launch: " + ", ".join(parts)


def time_class(config, runs: int) -> list[float]:
    from classy import Class

    from boltzmann.class_reference import class_parameters

    pars = class_parameters(config, pk=False, cl=True)
    walls = []
    for _ in range(runs):
        m = Class()
        m.set(pars)
        t0 = time.perf_counter()
        m.compute()
        if config.output.lensing:
            m.lensed_cl(int(config.output.l_max))
        else:
            m.raw_cl(int(config.output.l_max))
        walls.append(time.perf_counter() - t0)
        m.struct_cleanup()
    return walls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/planck_cl.yaml")
    parser.add_argument("--backend", default="auto", choices=("auto", "jax", "cuda"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--class", dest="with_class", action="store_true",
                        help="also time CLASS (classy) on the same request")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--gradients", action="store_true",
                        help="time ClFunction's value and Jacobian instead")
    parser.add_argument("--parameters", nargs="+", default=None,
                        help="(--gradients) parameters (default: all the cosmology has)")
    parser.add_argument("--l-max", type=int, default=None, help="override output.l_max")
    parser.add_argument("--lensing", choices=("on", "off"), default=None,
                        help="override output.lensing")
    parser.add_argument("--sec-weight", type=float, default=None,
                        help="(--gradients) ClFunction's sensitivity error weight (default: its "
                             "own; docs/gradients.md); --out also gets the Jacobian as .npz")
    parser.add_argument("--direction-block", default=None,
                        help="(--gradients) ClFunction's direction_block: tangent directions "
                             "per pass of the line of sight, comma-separated values timed one "
                             "after another in this process (default: its own)")
    parser.add_argument("--los-batch", default="auto",
                        help="multipoles per line-of-sight iteration, comma-separated values "
                             "timed one after another in this process (auto: "
                             "line_of_sight.multipole_batch, 1 on a CPU), e.g. 1,auto")
    parser.add_argument("--coarser", type=float, default=1.0,
                        help="ClSampling().coarser(FACTOR) (1: the default sampling)")
    args = parser.parse_args(argv)

    from boltzmann import runtime
    from boltzmann.params import load_config

    config = load_config(args.config)
    if not getattr(config.output, "cl", None):
        parser.error(f"{args.config} asks for no C_l (output.cl): use a C_l config such as "
                     "configs/planck_cl.yaml")
    out = {}
    if args.l_max is not None:
        out["l_max"] = args.l_max
    if args.lensing is not None:
        out["lensing"] = args.lensing == "on"
    if out:
        import dataclasses

        config = dataclasses.replace(config, output=dataclasses.replace(config.output, **out))
    settings = runtime.Settings.from_environment()     # float64, the persistent cache, as the CLI
    runtime.configure(settings)
    backend = runtime.backend_for(args.backend, settings)
    if args.gradients:
        return _gradients_report(args, config, backend)
    if args.coarser != 1.0:
        parser.error("--coarser applies to --gradients only")
    if args.with_class:
        try:
            import classy  # noqa: F401
        except ImportError:
            parser.error("--class needs classy (the reference extra: pip install -e '.[reference]')")
    rows = []
    for value in args.los_batch.split(","):
        value = value.strip()
        rows += time_ours(config, backend, args.runs, None if value == "auto" else int(value))
    result = dict(_header(args, config), runs=rows)
    print(f"\n{args.config}, backend {args.backend} on {result['device']}, "
          f"{result['date']}: l_max = {result['l_max']}, lensing = {result['lensing']}\n")
    print("| line-of-sight batch | run | total [s] | " + " | ".join(STAGES) + " |")
    print("|---|---|---|" + "---|" * len(STAGES))
    for r in rows:
        print(f"| {r['los_batch']} | {r['run']} | {r['total_s']:.2f} | "
              + " | ".join(f"{r[s + '_s']:.2f}" for s in STAGES) + " |")
    if args.with_class:
        walls = time_class(config, max(args.runs, 2))
        result["class_s"] = walls
        warm = float(np.median([r["total_s"] for r in rows[1:]])) if len(rows) > 1 else None
        print(f"\nCLASS (default precision, same request): {', '.join(f'{w:.2f}' for w in walls)}"
              f" s" + (f"; ours warm / CLASS = {warm / min(walls):.1f}" if warm else ""))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_cl.json").write_text(json.dumps(result, indent=1, default=str))


def _header(args, config) -> dict:
    """What every bench_cl.json starts with: the request, the machine and the date."""
    return {"config": args.config, "backend": args.backend, "device": device_name(),
            "host": platform.node(), "date": datetime.date.today().isoformat(),
            "l_max": int(config.output.l_max), "lensing": bool(config.output.lensing)}


def _gradients_report(args, config, backend) -> None:
    """``--gradients``: value and Jacobian timed once per ``--direction-block`` value, one
    ``ClFunction`` after another in this process (the later ones load what the first compiled
    from the persistent cache, so their first calls are not first runs)."""
    from boltzmann.cmb.sampling import ClSampling

    sampling = ClSampling() if args.coarser == 1.0 else ClSampling().coarser(args.coarser)
    blocks = [None] if args.direction_block is None else \
        [int(b) for b in str(args.direction_block).split(",")]
    jac, runs = {}, []
    for block in blocks:
        runs.append(time_gradients(config, backend, args.runs, args.parameters, sampling,
                                   args.sec_weight, jac, block))
    g = runs[0]
    result = dict(_header(args, config), coarser=args.coarser, sec_weight=args.sec_weight,
                  gradients=g, by_direction_block=runs)
    print(f"\n{args.config}, backend {args.backend} on {result['device']}, {result['date']}: "
          f"l_max = {result['l_max']}, lensing = {result['lensing']}, sampling coarser "
          f"{args.coarser:g}, {g['modes']} modes, {g['samples']} samples, parameters "
          f"{', '.join(g['parameters'])}, sensitivity weight "
          f"{'default' if args.sec_weight is None else args.sec_weight}\n")
    print("| direction block | value first / warm [s] | Jacobian first / warm [s] | "
          "Jacobian / value |")
    print("|---|---|---|---|")
    for r in runs:
        warm_v = min(r["value_s"][1:] or r["value_s"])
        warm_j = min(r["jacobian_s"][1:] or r["jacobian_s"])
        print(f"| {r['direction_block']} | {r['value_s'][0]:.2f} / {warm_v:.2f} | "
              f"{r['jacobian_s'][0]:.2f} / {warm_j:.2f} | {warm_j / warm_v:.2f} |")
    for r in runs:
        print(f"\nJacobian stages [s] (direction block {r['direction_block']}), run by run:")
        for i, st in enumerate(r["jacobian_stages_s"]):
            print(f"  {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in st.items())
                  + _launch_text(r["sensitivity_launch"][i]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_cl_gradients.json").write_text(json.dumps(result, indent=1,
                                                                     default=str))
        np.savez(args.out / "bench_cl_jacobian.npz", parameters=np.array(g["parameters"]), **jac)


if __name__ == "__main__":
    main()
