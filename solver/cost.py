"""Operation counts: how much arithmetic one Rodas5P step of an RHS costs.

``count_ops`` counts the arithmetic and transcendental operations of a function's jaxpr;
``work_estimate`` adds up one step of the ensemble solver from them and from the solver's own
structure (colours, LU operation counts, the tableau), so a measured time can be turned into
achieved FLOP/s. Transcendentals are charged ``TRANSCENDENTAL_FLOPS`` each.
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["count_ops", "work_estimate", "TRANSCENDENTAL_FLOPS"]

#: fp64 flop-equivalents charged per transcendental (exp, log, sqrt, pow, ...): on NVIDIA GPUs
#: these are software sequences of roughly 10-40 DFMA-class instructions; 20 is a round middle
TRANSCENDENTAL_FLOPS = 20

_ARITH = {"add", "sub", "mul", "div", "neg", "max", "min", "abs", "sign", "square", "rem",
          "add_any", "dot_general", "reduce_sum", "reduce_max", "reduce_min", "cumsum",
          "floor", "ceil", "round", "clamp", "select_n", "nextafter"}
_TRANS = {"exp", "exp2", "log", "log1p", "expm1", "sqrt", "rsqrt", "cbrt", "pow", "sin", "cos",
          "tan", "tanh", "atan", "atan2", "asin", "acos", "sinh", "cosh", "erf", "erfc",
          "logistic", "lgamma", "digamma"}


def count_ops(fn, *example) -> dict:
    """Arithmetic and transcendental operation counts of ``fn``'s jaxpr (per call).

    Each equation counts once per output element (integer_pow y**n as n-1 multiplies,
    dot_general as 2 m n k); sub-jaxprs (pjit, custom_jvp, cond branches: the largest) are walked.
    Gathers, selects of constants, converts and shape ops are not counted.
    """
    import jax

    closed = jax.make_jaxpr(fn)(*example)
    counts = {"arith": 0, "transcendental": 0}
    _walk(closed.jaxpr, counts)
    return counts


def _size(v) -> int:
    shape = getattr(getattr(v, "aval", None), "shape", ())
    return int(np.prod(shape)) if shape else 1


def _walk(jaxpr, counts, mult: int = 1):
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        out = max((_size(v) for v in eqn.outvars), default=1)
        subs = []
        for p in eqn.params.values():
            for q in (p if isinstance(p, (tuple, list)) else (p,)):
                if hasattr(q, "eqns"):
                    subs.append(q)
                elif hasattr(q, "jaxpr") and hasattr(q.jaxpr, "eqns"):
                    subs.append(q.jaxpr)
        if subs:
            if name == "cond":
                best = None
                for s in subs:
                    c = {"arith": 0, "transcendental": 0}
                    _walk(s, c, mult)
                    if best is None or c["arith"] > best["arith"]:
                        best = c
                for k in counts:
                    counts[k] += best[k]
            else:
                for s in subs:
                    _walk(s, counts, mult)
            continue
        if name == "integer_pow":
            counts["arith"] += mult * out * max(abs(int(eqn.params.get("y", 2))) - 1, 1)
        elif name == "dot_general":
            lhs = eqn.invars[0].aval.shape
            (lc, _), _ = eqn.params["dimension_numbers"]
            k = int(np.prod([lhs[i] for i in lc])) if lc else 1
            counts["arith"] += mult * 2 * out * k
        elif name in _TRANS:
            counts["transcendental"] += mult * out
        elif name in _ARITH:
            counts["arith"] += mult * out


def work_estimate(rhs, n: int, n_params: int, args=None, y=None, p=None) -> dict:
    """Rough fp64 operation count of one Rodas5P step (what both our backends execute).

    per step = Jacobian (one primal RHS + (colours + 1) JVP sweeps; a sweep's cost is the JVP
    jaxpr minus the primal's — an upper bound for the CUDA kernel, where Enzyme folds the literal
    seeds) + W assembly (nslots + n) + sparse LU factorisation (the symbolic LU's own count) +
    8 triangular solves + 7 further RHS evaluations + the stage combinations (2n per nonzero
    tableau coefficient in a, C, d, b, e) + the error norm (~6n). Transcendentals are charged
    TRANSCENDENTAL_FLOPS each. Dense output (only at save times) and the controller (scalars) are
    left out. Sparsity, colouring and LU are the solver's own (``solver.linalg``), built here
    once more.
    """
    import jax
    import jax.numpy as jnp

    from .linalg.jacobian import build_jacobian_plan
    from .linalg.linear import build_linear_solver
    from .linalg.sparsity import detect_sparsity
    from .method.tableau import RODAS5P as tab

    t0 = time.perf_counter()
    y = jnp.ones(n) * 0.1 if y is None else jnp.asarray(y)
    p = jnp.ones(max(n_params, 1)) if p is None else jnp.asarray(p)
    if args is None:
        pattern = detect_sparsity(rhs, n, n_params)

        def f(y_, t_):
            return jnp.stack(jnp.broadcast_arrays(*rhs(y_, t_, p)))
    else:
        pattern = detect_sparsity(rhs, n, n_params, args=args)

        def f(y_, t_):
            return jnp.stack(jnp.broadcast_arrays(*rhs(y_, t_, p, args)))
    pattern = np.asarray(pattern, bool) | np.eye(n, dtype=bool)
    linear = build_linear_solver(pattern, method="sparse")
    n_factor, n_solve = linear.symbolic.op_counts()
    colors = build_jacobian_plan(pattern, linear).n_colors
    t = jnp.asarray(0.5)
    prim = count_ops(f, y, t)
    both = count_ops(lambda y_, t_, dy, dt: jax.jvp(f, (y_, t_), (dy, dt)), y, t, y, t)
    tangent = {k: both[k] - prim[k] for k in prim}

    def flops(c):
        return c["arith"] + TRANSCENDENTAL_FLOPS * c["transcendental"]

    s = tab.stages
    nnz = (int(np.count_nonzero(tab.a)) + int(np.count_nonzero(tab.C))
           + int(np.count_nonzero(tab.d)) + int(np.count_nonzero(tab.b))
           + int(np.count_nonzero(tab.e)))
    parts = {
        "jacobian": flops(prim) + (colors + 1) * flops(tangent),
        "w_assembly": linear.nslots + n,
        "lu_factor": n_factor,
        "triangular_solves": s * n_solve,
        "stage_rhs": (s - 1) * flops(prim),
        "stage_combinations": 2 * n * nnz,
        "error_norm": 6 * n,
    }
    return {"n": n, "pattern_nnz": int(pattern.sum()), "lu_slots": int(linear.nslots),
            "colours": int(colors), "rhs_arith": prim["arith"],
            "rhs_transcendental": prim["transcendental"], "jvp_sweep_arith": tangent["arith"],
            "jvp_sweep_transcendental": tangent["transcendental"], "lu_factor_ops": n_factor,
            "lu_solve_ops": n_solve, "per_step": parts,
            "flops_per_step": int(sum(parts.values())),
            "estimate_seconds": time.perf_counter() - t0}
