"""Where a later process's P(k) Jacobian waits: each of its persisted programs (inputs, solve)
timed step by step — deserialising the stored program, lowering, loading the executable from
the XLA cache, a first and a second execution — with the system time, minor page faults and peak
RSS of each step.

Run it on a cache folder that a first ``transfer.py --gradients`` run (or bench_first_run.py)
filled: ``python scripts/jacobian_load_split.py --cache-dir DIR [--config lcdm]``. A step that
compiles instead of loading (a cache from other code) shows as minutes in "load".
"""
import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from compile_jacobian_programs import program_call  # noqa: E402

from boltzmann import pipeline, runtime  # noqa: E402
from boltzmann.cli import resolve_config_path  # noqa: E402
from boltzmann.gradients import PowerSpectrumFunction, available_parameters  # noqa: E402
from boltzmann.params import load_config  # noqa: E402


class Marks:
    """Prints the wall and system seconds, minor faults and peak RSS since the last mark."""

    def __init__(self):
        self.last = (time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF))

    def __call__(self, label: str) -> None:
        t, r = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        t0, r0 = self.last
        print(f"| {label} | {t - t0:.2f} | {r.ru_stime - r0.ru_stime:.2f} | "
              f"{r.ru_minflt - r0.ru_minflt} | {r.ru_maxrss / 1024:.0f} |", flush=True)
        self.last = (t, r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", required=True, type=Path)
    ap.add_argument("--config", default="lcdm")
    args = ap.parse_args()
    runtime.configure(runtime.Settings(cache_root=args.cache_dir))
    config = load_config(resolve_config_path(args.config))
    result = pipeline.run(config, backend="jax")
    fn = PowerSpectrumFunction(config, parameters=available_parameters(config.cosmology),
                               k=result.k[0], z=result.z, backend="jax")
    print("| step | wall [s] | system [s] | minor faults | peak RSS [MiB] |\n|---|---|---|---|---|")
    mark = Marks()
    inputs_out = None
    for name in ("inputs", "solve"):
        program, call_args = program_call(fn, name, inputs_out)
        runnable, leaves = program._program_for(call_args)   # the store's program, not plain jit
        mark(f"{name}: deserialise the stored program")
        lowered = runnable.lower(*leaves)
        mark(f"{name}: lower")
        compiled = lowered.compile()
        mark(f"{name}: load the executable (XLA cache)")
        out = jax.block_until_ready(compiled(*leaves))
        mark(f"{name}: first execution")
        jax.block_until_ready(compiled(*leaves))
        mark(f"{name}: second execution")
        if name == "inputs":
            inputs_out = out


if __name__ == "__main__":
    main()
