"""Source generator for the CUDA backend's ensemble kernel.

Pure host-side Python: nothing here imports numba. :func:`generate_kernel_source` returns the text
of a module that defines, undecorated,

* ``lu_factor(a, out)`` / ``lu_solve(lu, b, out)`` -- the compiled sparse LU in ``out`` form
  (``spec.lu_source_to_out_form``);
* ``f_eval(y, t, p, args, out)`` -- the model's tuple-returning RHS called on tuples built with
  literal indices, results stored into ``out``;
* ``jac_eval(y, t, p, args, jv, dfdt)`` -- one Enzyme forward sweep per colour group plus one in
  ``t`` (numba-enzyme-cuda ``jvp`` of the tuple-returning primal, at most 8 directions per call),
  the seeds written as literals into local arrays (so the compiler can fold them), the compressed
  columns deposited straight into the LU slots (``jv[slot] = tangent[direction, row]``);
* ``wrms(e, ya, yb, rtol, atol, wt, nw)`` -- the weighted RMS error norm of the JAX backend;
* ``kernel(...)`` -- one trajectory per thread (``codegen.rodas``);
* ``jac_kernel(...)`` -- f, J and df/dt at given points through the same device code (tests).

With tables (``spec.n_tv > 0``; the RHS provides a table split, see ``cuda.tables``) the primal is
the table-free core ``rhs(y, t, p, tv)`` and ``tv`` comes from a plain device function reading the
``args`` array, outside Enzyme: ``f_eval`` calls ``rhs(y, t, p, table_values(t, p, args))``;
``jac_eval`` evaluates ``tv = table_values(t, p, args)`` and ``dtv = table_values_dt(t, p, args)``
once, seeds the colour sweeps with ``(s_c, 0, 0, 0)`` and the time sweep with ``(0, 1, 0, dtv)`` --
so its tangent is ∂f/∂t + ∂f/∂tv · dtv/dt, the chain rule through the table. Without tables
(``n_tv = 0``) ``args`` is an unused 1-element dummy.

The module expects these globals to be injected before it is used: ``cuda`` (``cuda.grid``,
``cuda.local.array``), ``F64`` (the float64 dtype for local arrays), ``rhs`` (the primal device
function), ``jvp_rhs`` (its Enzyme ``jvp``) and, with tables, ``table_values`` and
``table_values_dt``. The CUDA backend binds them to numba-cuda-mlir and numba-enzyme-cuda objects
(``cuda.modules``); the CPU emulator (``cuda.emulation``) binds numpy/JAX stand-ins, so the very
same text runs on a CPU.
"""
from __future__ import annotations

import numpy as np

from .rodas import emit_kernel
from .spec import KERNEL_ARGS, MAX_DIRECTIONS, KernelSpec, check_spec, lu_source_to_out_form

__all__ = ["generate_kernel_source", "emit_helpers"]


def emit_helpers(spec: KernelSpec) -> list[str]:
    n, P, T = spec.n, spec.n_params, spec.n_tv
    ytup = "(" + ", ".join(f"y[{q}]" for q in range(n)) + ("," if n == 1 else "") + ")"
    ptup = "(" + ", ".join(f"p[{q}]" for q in range(P)) + ("," if P == 1 else "") + ")"
    if T:
        # the table values enter the core as a tuple of scalars (the lookup runs outside Enzyme)
        call_extra = ", table_values(t, p, args)"
    else:
        call_extra = ", args" if spec.has_args else ""
    L = []
    L += [
        "def _nmax(a, b):",
        "    # jnp.maximum: NaN if either is NaN",
        "    if a != a or b != b:",
        "        return a + b",
        "    return a if a > b else b",
        "",
        "def _nmin(a, b):",
        "    if a != a or b != b:",
        "        return a + b",
        "    return a if a < b else b",
        "",
        "def _isfin(v):",
        "    return abs(v) <= 1.7976931348623157e308",
        "",
        "def f_eval(y, t, p, args, out):",
        f"    r = rhs({ytup}, t, {ptup}{call_extra})",
    ]
    for q in range(n):
        L.append(f"    out[{q}] = r[{q}]")
    L.append("")
    L += [
        "def wrms(e, ya, yb, rtol, atol, wt, nw):",
        "    acc = 0.0",
        f"    for q in range({n}):",
        "        sc = atol[q] + rtol * _nmax(abs(ya[q]), abs(yb[q]))",
        "        r = wt[q] * e[q] / sc",
        "        acc += r * r",
        "    return math.sqrt(acc / nw)",
        "",
    ]
    # --- Jacobian: colour sweeps + the time sweep, chunks of MAX_DIRECTIONS per jvp call; with
    # a declared Jacobian the time sweep alone, the entries written by jac_entries
    if spec.direct_source:
        L += ["M = math", ""] + spec.direct_source.splitlines() + [""]
    dirs = [("color", c) for c in range(spec.n_colors)] + [("time", None)]
    chunks = [dirs[i:i + MAX_DIRECTIONS] for i in range(0, len(dirs), MAX_DIRECTIONS)]
    colors = np.asarray(spec.colors)
    L += ["def jac_eval(y, t, p, args, jv, dfdt):",
          f"    zp = cuda.local.array({P}, F64)"]
    L += [f"    zp[{q}] = 0.0" for q in range(P)]
    L += [f"    zy = cuda.local.array({n}, F64)"]
    L += [f"    zy[{q}] = 0.0" for q in range(n)]
    if T:
        # tables: the primal point tv and, for the t sweep, the chain-rule seed dtv/dt; the
        # colour sweeps hold tv fixed (it does not depend on y)
        L += ["    tvt = table_values(t, p, args)",
              "    dtvt = table_values_dt(t, p, args)",
              f"    tv = cuda.local.array({T}, F64)",
              f"    dtv = cuda.local.array({T}, F64)",
              f"    ztv = cuda.local.array({T}, F64)"]
        for q in range(T):
            L += [f"    tv[{q}] = tvt[{q}]", f"    dtv[{q}] = dtvt[{q}]", f"    ztv[{q}] = 0.0"]
    primal = "y, t, p, tv" if T else "y, t, p"
    zero_tv = ", ztv" if T else ""
    time_tv = ", dtv" if T else ""
    for c in range(spec.n_colors):
        L.append(f"    sd{c} = cuda.local.array({n}, F64)")
        for q in range(n):
            L.append(f"    sd{c}[{q}] = {'1.0' if colors[q] == c else '0.0'}")
    where = {}  # direction -> (chunk index, row in chunk, chunk width)
    for ci, chunk in enumerate(chunks):
        w = len(chunk)
        if w > 1:
            L.append(f"    tg{ci} = cuda.local.array(({w}, {n}), F64)")
        else:
            L.append(f"    tg{ci} = cuda.local.array({n}, F64)")
        parts = []
        for di, (kind, c) in enumerate(chunk):
            where[(kind, c)] = (ci, di, w)
            if kind == "color":
                parts.append(f"sd{c}, 0.0, zp{zero_tv}")
            else:
                parts.append(f"zy, 1.0, zp{time_tv}")
        L.append(f"    jvp_rhs(tg{ci}, {primal}, " + ", ".join(parts) + ")")

    def tref(key, row):
        ci, di, w = where[key]
        return f"tg{ci}[{di}, {row}]" if w > 1 else f"tg{ci}[{row}]"

    for s, c, row in spec.jac_slots:
        L.append(f"    jv[{s}] = {tref(('color', c), row)}")
    if spec.direct_source:
        # slots no entry fills (LU fill, an untouched diagonal) are read as zeros
        covered = set(spec.direct_slots)
        L += [f"    jv[{s}] = 0.0" for s in range(spec.nslots) if s not in covered]
        L.append("    jac_entries(t, p, tv, jv)" if T else "    jac_entries(t, p, jv)")
    for q in range(n):
        L.append(f"    dfdt[{q}] = {tref(('time', None), q)}")
    L.append("")
    return L


def _emit_jac_kernel(spec: KernelSpec) -> list[str]:
    """A test kernel: f, J (slot layout) and df/dt at given points through the same device code."""
    n, P, ns = spec.n, spec.n_params, spec.nslots
    return ["def jac_kernel(y_in, t_in, params, args, f_out, jv_out, dfdt_out, n_traj):",
            "    i = cuda.grid(1)",
            "    if i >= n_traj:",
            "        return",
            f"    y = cuda.local.array({n}, F64)",
            f"    f0 = cuda.local.array({n}, F64)",
            f"    dfdt = cuda.local.array({n}, F64)",
            f"    jv = cuda.local.array({ns}, F64)",
            f"    p = cuda.local.array({P}, F64)",
            f"    for q in range({P}):",
            "        p[q] = params[i, q]",
            f"    for q in range({n}):",
            "        y[q] = y_in[i, q]",
            f"    for s in range({ns}):",
            "        jv[s] = 0.0",
            "    f_eval(y, t_in[i], p, args, f0)",
            "    jac_eval(y, t_in[i], p, args, jv, dfdt)",
            f"    for q in range({n}):",
            "        f_out[i, q] = f0[q]",
            "        dfdt_out[i, q] = dfdt[q]",
            f"    for s in range({ns}):",
            "        jv_out[i, s] = jv[s]",
            ""]


def generate_kernel_source(spec: KernelSpec) -> str:
    """The full module text (see the module docstring for what it defines and expects)."""
    check_spec(spec)
    tables = (f"rhs(y, t, p, tv) is the table-free core; tv = table_values(t, p, args) "
              f"({spec.n_tv} values), d tv/dt = table_values_dt(t, p, args); args is the tables' "
              "C-contiguous float64 device array, of the model's own ndim.") if spec.n_tv else \
        "rhs(y, t, p); args is an unused float64 dummy of shape (1,)."
    head = [f'"""Generated Rodas ensemble kernel: n={spec.n}, P={spec.n_params}, '
            f'nslots={spec.nslots}, colours={spec.n_colors}, tableau={spec.tableau.name}.',
            "",
            "kernel(" + ", ".join(KERNEL_ARGS) + "): one trajectory per thread.",
            tables,
            '"""',
            "import math", ""]
    body = emit_helpers(spec) + emit_kernel(spec) + _emit_jac_kernel(spec)
    return "\n".join(head) + "\n" + lu_source_to_out_form(spec.lu_source) + "\n\n" + \
        "\n".join(body) + "\n"


