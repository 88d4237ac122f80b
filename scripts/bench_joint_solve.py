"""Cost of the JAX backend's forward-sensitivity (joint) solve inside the end-to-end Jacobian.

Builds tests/test_gradients.py's case (configs/lcdm_reduced.yaml at rtol 1e-7, 8 k from the
CLASS derivative table, all 10 parameters), then times ``jax.jit(jax.jacfwd(...))`` of the
whole pipeline in stages -- trace/lower, XLA compile, first and second run -- and prints the
joint plan's linear-algebra size (slots, colours) next to the plain plan's.

    python scripts/bench_joint_solve.py          # CPU; ~4 min on the 2-core dev machine
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)


def main():
    from test_gradients import K_ROWS, _config, _reference

    from boltzmann.gradients import PowerSpectrumFunction
    from solver import api
    from solver import sensitivity as sm

    k_ref, _ = _reference()
    fn = PowerSpectrumFunction(_config(1e-7), k=k_ref[K_ROWS], n_chunks=1)
    th = fn.theta0
    t = time.perf_counter()
    lowered = fn._jit_jac.lower(th)
    print(f"{jax.default_backend()}: trace/lower {time.perf_counter() - t:.1f} s", flush=True)
    for name, plans in (("joint", sm._JOINT_PLANS), ("plain", api._PLANS)):
        for plan in plans.values():
            lin = plan.linear
            ops = lin.symbolic.op_counts() if lin.symbolic is not None else "-"
            print(f"{name} plan: n {lin.n}, slots {lin.nslots}, method {lin.method}, "
                  f"LU ops (factor, solve) {ops}, colours {plan.n_colors}", flush=True)
    t = time.perf_counter()
    compiled = lowered.compile()
    print(f"compile {time.perf_counter() - t:.1f} s", flush=True)
    for label in ("run", "run (warm)"):
        t = time.perf_counter()
        jax.block_until_ready(compiled(th))
        print(f"{label} {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
