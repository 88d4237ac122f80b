#!/usr/bin/env python
"""How large the P(k) Jacobian's compiled programs are, and what compiling each costs: one of
``PowerSpectrumFunction``'s three programs (inputs, solve, outputs) lowered and compiled alone in
this process, without any persistent cache — StableHLO operations (and, with ``--by-site``, how
many come from each generated function and solver call site; with ``--by-source``, from each
file and line of this project's source), seconds to lower and to compile,
the optimized HLO's instruction count and the process's peak resident memory.

Run one program per process, so that the peak is that program's:

    python scripts/compile_jacobian_programs.py --program solve [--config configs/lcdm.yaml]
    python scripts/compile_jacobian_programs.py --program inputs --by-source
"""
from __future__ import annotations

import argparse
import collections
import re
import resource
import time
from pathlib import Path

import jax

REPO = Path(__file__).resolve().parents[1]


def _op_frames(text: str):
    """The call frames ("file:line", innermost first) of every StableHLO operation of a
    lowering's text with debug info."""
    alias = dict(re.findall(r"^(#loc\d+) = (loc\(.*\))$", text, re.M))
    memo: dict = {}

    def frames(a, depth=0):
        if a not in memo:
            out = []
            for m in re.finditer(r'"([^"]+)":(\d+)|(#loc\d+)', alias.get(a, a)):
                if m.group(1):
                    out.append(f"{m.group(1)}:{m.group(2)}")
                elif depth < 40:
                    out.extend(frames(m.group(3), depth + 1))
            memo[a] = out
        return memo[a]

    for line in text.splitlines():
        if "stablehlo." not in line or line.startswith("#loc"):
            continue
        m = re.search(r"loc\((#loc\d+)\)\s*$", line)
        yield frames(m.group(1)) if m else []


def _sites(text: str) -> collections.Counter:
    """StableHLO operations per (generated function, solver call site) from the debug info."""
    count = collections.Counter()
    for fr in _op_frames(text):
        short = [x.split("/")[-1] for x in fr]
        generated = re.sub(r"-[0-9a-f]{6,}>", ">",
                           next((x.split(":")[0] for x in short if x.startswith("<")), "-"))
        site = next((x for x in short if x.startswith(("ensemble.py", "rosenbrock.py"))), "-")
        count[(generated, site)] += 1
    return count


def _source_lines(text: str) -> collections.Counter:
    """StableHLO operations per innermost line of this project's source ("-": none but the
    caller's, e.g. JAX's own reshapes and broadcasts of jacfwd), e.g. the inputs program's,
    which runs no generated function or solver."""
    root = str(REPO) + "/"
    caller = ("scripts/", "solver/persisted.py")
    count = collections.Counter()
    for fr in _op_frames(text):
        ours = [x[len(root):] for x in fr
                if x.startswith(root) and not x[len(root):].startswith(caller)]
        count[ours[0] if ours else "-"] += 1
    return count


def program_call(fn, program: str, inputs=None, solved=None):
    """(the persisted program, its call arguments) for one of ``fn``'s three Jacobian programs;
    ``inputs`` and ``solved`` are the inputs and solve programs' outputs (values or shape
    structs), needed by the programs that read them."""
    if program == "inputs":
        return fn._jit_inputs_jvp, (fn.theta0,)
    (table, rows, y0, background), (dtable, drows, dy0, dbackground) = inputs
    if program == "solve":
        groups = fn._chunk_groups         # one group's run (on the JAX backend); None: all
        return fn._jit_solve_jvp, (table, rows, y0, dtable, drows, dy0) + (
            () if groups is None else (groups[0],))
    ys, dys = solved
    return fn._jit_outputs_jvp, (fn.theta0, ys, rows, table, background, dys, drows, dtable,
                                 dbackground)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "lcdm.yaml"))
    parser.add_argument("--program", choices=("inputs", "solve", "outputs"), default="solve")
    parser.add_argument("--by-site", action="store_true")
    parser.add_argument("--by-source", action="store_true",
                        help="operations per source file and line of this project")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    from boltzmann.gradients import PowerSpectrumFunction
    from boltzmann.params import load_config

    fn = PowerSpectrumFunction(load_config(args.config))
    inputs = jax.eval_shape(fn._inputs_and_tangents, fn.theta0)
    solved = None
    if args.program == "outputs":
        solved = jax.eval_shape(fn._solve_and_tangents, *program_call(fn, "solve", inputs)[1])
    jitted, call = program_call(fn, args.program, inputs, solved)
    t0 = time.perf_counter()
    lowered = jitted.lower(*call)
    t1 = time.perf_counter()
    text = lowered.as_text(debug_info=args.by_site or args.by_source)
    n_ops = sum(1 for line in text.splitlines()
                if "stablehlo." in line and not line.startswith("#loc"))
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    hlo = compiled.as_text()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(f"{args.program}: {n_ops} StableHLO operations; lowered in {t1 - t0:.1f} s, compiled "
          f"in {t3 - t2:.1f} s; optimized HLO {sum(1 for x in hlo.splitlines() if ' = ' in x)} "
          f"instructions; peak resident memory {peak:.2f} GB")
    if args.by_site:
        for (generated, site), c in _sites(text).most_common(12):
            print(f"  {c:7d}  {generated:24s} {site}")
    if args.by_source:
        lines = _source_lines(text)
        files = collections.Counter()
        for where, c in lines.items():
            files[where.split(":")[0]] += c
        for title, table in (("per file", files), ("per line", lines)):
            print(f"  {title}:")
            for where, c in table.most_common(15):
                print(f"  {c:7d}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
