"""What every part of scripts/bench_gpu.py shares: the report (rows printed as they come,
bench_gpu.json and bench_gpu.md), the time budget and its projections, warm-call timing, the
work estimate's printout, the run's solver backend objects and the first-row guesses.
Imported by bench_gpu.py (which sets up JAX first) and bench_grad.py."""
from __future__ import annotations

import json
import math
import os
import time

import jax
import numpy as np

from solver.cost import TRANSCENDENTAL_FLOPS

#: first-row guesses [s] (compile + one run) before anything was measured, per (part, backend);
#: from docs/benchmarks.md (H200: lattice JAX first call 25.6 s, CUDA 24.9 s; EB JAX ~40 s)
PRIOR_FIRST_S = {"vdp:cuda": 30.0, "vdp:jax": 30.0, "vdp:diffrax": 40.0, "eb:cuda": 90.0,
                 "eb:jax": 90.0, "grad:cuda": 300.0, "grad:jax": 200.0}

#: the solver backend objects of this run, by name (``main`` fills it from the environment's
#: settings, so the CUDA kernels come from and go to the persistent cache like the CLI's)
SOLVER_BACKENDS: dict = {}


def solver_backend(name):
    """The backend object for a backend name (the name itself where none was configured)."""
    return SOLVER_BACKENDS.get(name, name)


# =========================================================================== output
class Report:
    """Prints rows as they come (flushed) and keeps everything for the JSON/Markdown files."""

    def __init__(self, out_dir: str | None = None):
        self.out_dir = out_dir
        self.lines: list[str] = []
        self.data: dict = {"vdp": [], "eb": [], "one": [], "grad": [], "notes": []}

    def print(self, line: str = ""):
        print(line, flush=True)
        self.lines.append(line)

    def row(self, part: str, row: dict, line: str):
        """Record a finished row, print it, and rewrite the files (a killed run keeps them)."""
        self.data[part].append(row)
        self.print(line)
        self.write()

    def note(self, text: str):
        self.data["notes"].append(text)
        self.print(f"note: {text}")

    def write(self):
        if not self.out_dir:
            return
        os.makedirs(self.out_dir, exist_ok=True)
        tmp = os.path.join(self.out_dir, ".bench_gpu.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(self.data, fh, indent=1, default=_json_default)
        os.replace(tmp, os.path.join(self.out_dir, "bench_gpu.json"))
        with open(os.path.join(self.out_dir, "bench_gpu.md"), "w") as fh:
            fh.write("\n".join(self.lines) + "\n")


def _json_default(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


class Budget:
    """Wall-clock budget of the whole run, with an optional earlier deadline per section."""

    def __init__(self, total_s: float, row_limit_s: float):
        self.t0 = time.perf_counter()
        self.total = float(total_s)
        self.row_limit = float(row_limit_s)
        self.section_end = self.total

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return min(self.total, self.section_end) - self.elapsed()

    def start_section(self, share: float):
        """This section may run until ``share`` of what is left of the whole budget is used."""
        self.section_end = self.elapsed() + share * (self.total - self.elapsed())

    def end_section(self):
        self.section_end = self.total

    def refuse(self, projected: float) -> str | None:
        """None if a row projected to take ``projected`` s may run, else the reason."""
        if projected > self.row_limit:
            return f"skipped: projected {projected:.0f} s > row limit {self.row_limit:.0f} s"
        if projected > self.left():
            return (f"skipped: projected {projected:.0f} s > {max(self.left(), 0):.0f} s left "
                    f"in the time budget")
        return None


def project(history: list, key: str, n: int, prior_first: float) -> float:
    """Projected seconds of a row (first call + one warm call) at size ``n`` for ``key``.

    From the largest measured size of the same key: its compilation time (first - warm) again —
    a new shape recompiles the XLA programs; the CUDA kernel is shape-independent, so "vdp:cuda"
    has none and "eb:cuda" only its XLA stages' (tables, ICs, spectra) — plus two runs of the warm time scaled as size**alpha. alpha is fitted
    to the two largest measured sizes when there are two (clipped to [0.3, 1.2]), else 1 on a
    CPU and 0.6 on a GPU (whose throughput grows with N until the device is full).
    """
    done = sorted((r for r in history if r.get("key") == key and r.get("status") == "ok"),
                  key=lambda r: r["size"])
    if not done:
        return prior_first
    last = done[-1]
    alpha = 1.0 if jax.default_backend() == "cpu" else 0.6
    if len(done) >= 2 and done[-2]["size"] < last["size"] and done[-2]["warm_s"] > 0:
        alpha = math.log(last["warm_s"] / done[-2]["warm_s"]) / math.log(
            last["size"] / done[-2]["size"])
        alpha = min(max(alpha, 0.3), 1.2)
    warm = last["warm_s"] * max(n / last["size"], 1.0) ** alpha
    if key == "vdp:cuda":
        compile_s = 0.0
    elif key == "eb:cuda" and "first_timings" in last:
        # the CUDA kernel is compiled once; only the XLA stages recompile for a new shape
        compile_s = sum(max(last["first_timings"][k] - last["timings"][k], 0.0)
                        for k in ("tables", "initial_conditions", "spectra"))
    else:
        compile_s = max(last["first_s"] - last["warm_s"], 0.0)
    return compile_s + 2.0 * warm


def _warm_calls(call, first_s, min_total=0.5, max_repeats=5):
    """Median warm time of repeated calls (more repeats for fast launches), and the last result."""
    times, res = [], None
    repeats = 1 if first_s > min_total else max_repeats
    for _ in range(repeats):
        t = time.perf_counter()
        res = call()
        times.append(time.perf_counter() - t)
        if sum(times) > min_total and len(times) >= 1:
            break
    return float(np.median(times)), len(times), res


def _unavailable_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


# =========================================================================== work estimate
def _gflops(work, steps_total, seconds):
    if not work or not seconds or not steps_total:
        return None
    return work["flops_per_step"] * steps_total / seconds / 1e9


def _print_work(report, label, w):
    p = w["per_step"]
    report.print(f"work/step {label}: n={w['n']}, pattern nnz {w['pattern_nnz']}, LU slots "
                 f"{w['lu_slots']}, colours {w['colours']}; RHS {w['rhs_arith']} arith + "
                 f"{w['rhs_transcendental']} transc., JVP sweep {w['jvp_sweep_arith']} + "
                 f"{w['jvp_sweep_transcendental']}; LU factor {w['lu_factor_ops']}, solve "
                 f"{w['lu_solve_ops']} ops -> {w['flops_per_step']:,} flop/step (Jacobian "
                 f"{p['jacobian']:,}, LU {p['lu_factor']:,}, 8 solves {p['triangular_solves']:,},"
                 f" 7 RHS {p['stage_rhs']:,}, vectors {p['stage_combinations'] + p['error_norm']:,}"
                 f"); transcendental = {TRANSCENDENTAL_FLOPS} flop")


def _fmt(x, spec, none="—"):
    return none if x is None else format(x, spec)


def _short(note: str, limit: int = 160) -> str:
    note = (note or "").replace("|", "/")
    return note if len(note) <= limit else note[:limit - 3] + "..."
