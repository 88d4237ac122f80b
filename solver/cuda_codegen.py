"""Source generator for the CUDA backend's ensemble kernel (DESIGN §4–§7, issue 4).

Pure host-side Python: nothing here imports numba.  :func:`generate_kernel_source` returns the text
of a module that defines, undecorated,

* ``lu_factor(a, out)`` / ``lu_solve(lu, b, out)`` -- the compiled sparse LU of
  :mod:`solver.sparse_lu` (``LinearSolver.source``), rewritten by an AST pass so the results land in
  an ``out`` array instead of a returned tuple (the arithmetic is the generated SSA text verbatim);
* ``f_eval(y, t, p, args, out)`` -- the model's tuple-returning RHS called on tuples built with
  literal indices, results stored into ``out``;
* ``jac_eval(y, t, p, args, jv, dfdt)`` -- one Enzyme forward sweep per colour group plus one in
  ``t`` (numba-enzyme-cuda ``jvp`` of the tuple-returning primal, at most 8 directions per call),
  the seeds written as literals into local arrays, the compressed columns deposited straight into
  the LU slots (``jv[slot] = tangent[direction, row]``);

With tables (``spec.n_tv > 0``; the RHS provides a ``TableSplit``, see ``solver.cuda_backend``)
the primal is the table-free core ``rhs(y, t, p, tv)`` and ``tv`` comes from a plain device
function reading the ``args`` array, outside Enzyme: ``f_eval`` calls
``rhs(y, t, p, table_values(t, p, args))``; ``jac_eval`` evaluates ``tv = table_values(t, p, args)``
and ``dtv = table_values_dt(t, p, args)`` once, seeds the colour sweeps with ``(s_c, 0, 0, 0)`` and
the time sweep with ``(0, 1, 0, dtv)`` -- so its tangent is ∂f/∂t + ∂f/∂tv · dtv/dt, the chain rule
through the table.  Without tables (``n_tv = 0``) ``args`` is an unused 1-element dummy.
* ``wrms(e, ya, yb, rtol, atol, wt, nw)`` -- the weighted RMS error norm of the JAX backend;
* ``kernel(...)`` -- one trajectory per thread: initial step (Hairer–Nørsett–Wanner), the Rodas
  stage loop unrolled with the tableau's literals (zero coefficients dropped), the PID controller,
  dense output at the save times and the status codes, all with the semantics of
  :func:`solver.jax_backend.make_ensemble_solver`.

The module expects these globals to be injected before it is used: ``cuda`` (``cuda.grid``,
``cuda.local.array``), ``F64`` (the float64 dtype for local arrays), ``rhs`` (the primal device
function), ``jvp_rhs`` (its Enzyme ``jvp``) and, with tables, ``table_values`` and
``table_values_dt`` (the split's lookup and its t-derivative, plain device functions).  The CUDA
backend binds them to numba-cuda-mlir and numba-enzyme-cuda objects;
``solver.cuda_backend.solve_emulated`` binds them to numpy/JAX stand-ins so the very same text runs
on a CPU (tests of the kernel logic without a GPU).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from .status import Status

__all__ = ["KernelSpec", "generate_kernel_source", "lu_source_to_out_form", "MAX_DIRECTIONS",
           "KERNEL_ARGS"]

#: numba-enzyme-cuda accepts at most this many direction sets in one ``jvp`` call.
MAX_DIRECTIONS = 8

#: The kernel's positional arguments, in order (the backend and the emulator both use it).
KERNEL_ARGS = ("y0", "t0", "t_end", "t_save", "params", "args", "rtol", "atol", "weights", "h0",
               "n_weighted", "ys", "t_out", "status", "n_accepted", "n_rejected", "n_traj")


@dataclass(frozen=True)
class KernelSpec:
    """Everything the kernel text depends on (and nothing it does not: tolerances are arguments)."""

    n: int
    n_params: int            # P as the RHS sees it (>= 1: the backend pads P = 0 with a dummy)
    has_args: bool
    max_steps: int
    lu_source: str           # LinearSolver.source (straight-line lu_factor / lu_solve)
    nslots: int
    diag_slots: tuple
    colors: tuple            # colour of each column
    n_colors: int
    jac_slots: tuple         # ((slot, colour, row), ...) for every slot in the pattern
    tableau: object
    controller: object
    n_tv: int = 0            # > 0: args are tables read through a TableSplit (see module doc)


def _lit(x) -> str:
    """Float literal that round-trips exactly."""
    x = float(x)
    if not np.isfinite(x):
        raise ValueError(f"non-finite literal {x}")
    return repr(x)


class _OutForm(ast.NodeTransformer):
    def visit_FunctionDef(self, node):
        node.args.args.append(ast.arg(arg="out"))
        self.generic_visit(node)
        return node

    def visit_Return(self, node):
        if not isinstance(node.value, ast.Tuple):
            raise ValueError("generated LU source: expected 'return (tuple)'")
        stmts = [ast.Assign(targets=[ast.Subscript(value=ast.Name("out", ast.Load()),
                                                   slice=ast.Constant(i), ctx=ast.Store())],
                            value=elt, lineno=0)
                 for i, elt in enumerate(node.value.elts)]
        return stmts


def lu_source_to_out_form(source: str) -> str:
    """Rewrite ``lu_factor(a)``/``lu_solve(lu, b)`` (tuple-returning) to ``(…, out)`` array form."""
    tree = ast.parse(source)
    names = [f.name for f in tree.body if isinstance(f, ast.FunctionDef)]
    if sorted(names) != ["lu_factor", "lu_solve"]:
        raise ValueError(f"LU source must define lu_factor and lu_solve, got {names}")
    tree = ast.fix_missing_locations(_OutForm().visit(tree))
    return ast.unparse(tree) + "\n"


def _emit_helpers(spec: KernelSpec) -> list[str]:
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
    # --- Jacobian: colour sweeps + the time sweep, chunks of MAX_DIRECTIONS per jvp call
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
    for q in range(n):
        L.append(f"    dfdt[{q}] = {tref(('time', None), q)}")
    L.append("")
    return L


def _emit_kernel(spec: KernelSpec) -> list[str]:
    tab, ctrl = spec.tableau, spec.controller
    n, P, S = spec.n, spec.n_params, tab.stages
    k_ctrl = tab.embedded_order + 1.0
    RUN, OK = int(Status.RUNNING), int(Status.OK)
    L = ["def kernel(" + ", ".join(KERNEL_ARGS) + "):",
         "    i = cuda.grid(1)",
         "    if i >= n_traj:",
         "        return",
         f"    y = cuda.local.array({n}, F64)",
         f"    y1 = cuda.local.array({n}, F64)",
         f"    yi = cuda.local.array({n}, F64)",
         f"    fi = cuda.local.array({n}, F64)",
         f"    f0 = cuda.local.array({n}, F64)",
         f"    dfdt = cuda.local.array({n}, F64)",
         f"    kk = cuda.local.array(({S}, {n}), F64)",
         f"    jv = cuda.local.array({spec.nslots}, F64)",
         f"    w = cuda.local.array({spec.nslots}, F64)",
         f"    lu = cuda.local.array({spec.nslots}, F64)",
         f"    p = cuda.local.array({P}, F64)",
         f"    for q in range({P}):",
         "        p[q] = params[i, q]",
         f"    for q in range({n}):",
         "        y[q] = y0[i, q]",
         "    t = t0[i]",
         "    te = t_end[i]",
         "    m = t_save.shape[1]",
         "    # save times at or before t0 get y0; the others NaN until a step passes them",
         "    js = 0",
         "    for j in range(m):",
         "        if t_save[i, j] <= t:",
         f"            for q in range({n}):",
         "                ys[i, j, q] = y[q]",
         "            js = j + 1",
         "        else:",
         f"            for q in range({n}):",
         "                ys[i, j, q] = math.nan",
         # ---------------- initial step (HNW I, §II.4), as jax_backend.initial_step
         "    span = te - t",
         "    hh = h0[i]",
         "    if hh != hh:",
         "        f_eval(y, t, p, args, f0)",
         "        d0 = wrms(y, y, y, rtol, atol, weights, n_weighted)",
         "        d1 = wrms(f0, y, y, rtol, atol, weights, n_weighted)",
         "        if d0 < 1e-5 or d1 < 1e-5:",
         "            hs = 1e-6",
         "        else:",
         "            hs = 0.01 * d0 / d1",
         "        hs = _nmin(hs, span)",
         f"        for q in range({n}):",
         "            yi[q] = y[q] + hs * f0[q]",
         "        f_eval(yi, t + hs, p, args, fi)",
         f"        for q in range({n}):",
         "            fi[q] = fi[q] - f0[q]",
         "        d2 = wrms(fi, y, y, rtol, atol, weights, n_weighted) / hs",
         "        dmax = _nmax(d1, d2)",
         "        if dmax <= 1e-15:",
         "            h1 = _nmax(1e-6, hs * 1e-3)",
         "        else:",
         f"            h1 = (0.01 / dmax) ** {_lit(1.0 / (tab.order + 1.0))}",
         "        hh = _nmin(100.0 * hs, h1)",
         "        if not (_isfin(hh) and hh > 0.0):",
         "            hh = 1e-6 * span",
         "        hh = _nmin(hh, span)",
         "    else:",
         "        hh = _nmin(hh, span)",
         "    h = hh",
         f"    st = {RUN} if te > t else {OK}",
         "    e1 = 1.0",
         "    e2 = 1.0",
         "    nacc = 0",
         "    nrej = 0",
         "    need_jac = True",
         f"    while st == {RUN}:",
         "        to_end = te - t",
         "        last = h >= to_end",
         "        if last:",
         "            h = to_end",
         "        if need_jac:",
         "            # f, J (slots) and df/dt at (y, t); unchanged after a rejection",
         "            f_eval(y, t, p, args, f0)",
         "            jac_eval(y, t, p, args, jv, dfdt)",
         "            need_jac = False",
         f"        inv = 1.0 / (h * {_lit(tab.gamma)})",
         f"        for s in range({spec.nslots}):",
         "            w[s] = -jv[s]",
         ]
    for d in spec.diag_slots:
        L.append(f"        w[{int(d)}] = w[{int(d)}] + inv")
    L.append("        lu_factor(w, lu)")
    # ---------------- stages, unrolled
    for st in range(S):
        L.append(f"        # stage {st}")
        if st == 0:
            src = "f0"
        else:
            terms = [f"{_lit(tab.a[st, j])} * kk[{j}, q]" for j in range(st) if tab.a[st, j] != 0.0]
            L.append(f"        for q in range({n}):")
            L.append("            yi[q] = y[q]" + "".join(f" + {t_}" for t_ in terms))
            L.append(f"        f_eval(yi, t + {_lit(tab.c[st])} * h, p, args, fi)")
            src = "fi"
        extra = []
        if tab.d[st] != 0.0:
            extra.append(f"hd * dfdt[q]")
            L.append(f"        hd = h * {_lit(tab.d[st])}")
        for j in range(st):
            if tab.C[st, j] != 0.0:
                extra.append(f"({_lit(tab.C[st, j])} / h) * kk[{j}, q]")
        L.append(f"        for q in range({n}):")
        L.append(f"            yi[q] = {src}[q]" + "".join(f" + {e}" for e in extra))
        L.append("        lu_solve(lu, yi, fi)")
        L.append(f"        for q in range({n}):")
        L.append(f"            kk[{st}, q] = fi[q]")
    # ---------------- solution, error estimate
    bt = [f"{_lit(tab.b[j])} * kk[{j}, q]" for j in range(S) if tab.b[j] != 0.0]
    et = [f"{_lit(tab.e[j])} * kk[{j}, q]" for j in range(S) if tab.e[j] != 0.0]
    L += [f"        for q in range({n}):",
          "            y1[q] = y[q]" + "".join(f" + {t_}" for t_ in bt),
          "            yi[q] = " + (" + ".join(et) if et else "0.0"),
          "        err = wrms(yi, y, y1, rtol, atol, weights, n_weighted)",
          "        finite = _isfin(err)",
          f"        for q in range({n}):",
          "            if not _isfin(y1[q]):",
          "                finite = False",
          "        accept = finite and err <= 1.0",
          "        err_s = _nmax(err if finite else 1.0, 1e-10)"]
    # PID factor with literal exponents; a zero exponent gives exactly 1.0, so it is dropped
    fac = [_lit(ctrl.safety)]
    for base, beta in (("err_s", ctrl.beta1), ("e1", ctrl.beta2), ("e2", ctrl.beta3)):
        if beta != 0.0:
            fac.append(f"{base} ** {_lit(-beta / k_ctrl)}")
    L += ["        if accept:",
          f"            fac = _nmin(_nmax({' * '.join(fac)}, {_lit(ctrl.factor_min)}), "
          f"{_lit(ctrl.factor_max)})",
          "        elif finite:",
          f"            fac = _nmin(_nmax({_lit(ctrl.safety)} * err_s ** {_lit(-1.0 / k_ctrl)}, "
          f"{_lit(ctrl.factor_min)}), 1.0)",
          "        else:",
          f"            fac = {_lit(ctrl.factor_min)}",
          "        h_new = h * fac",
          f"        dt_min = {_lit(ctrl.dt_min_rel)} * _nmax(abs(t), 1.0)",
          "        if accept:",
          "            # dense output for the save times this step passed",
          "            while js < m and (t_save[i, js] <= t + h or last):",
          "                th = (t_save[i, js] - t) / h",
          "                om = 1.0 - th"]
    H = tab.H
    L += [f"                for q in range({n}):"]
    for r in range(H.shape[0]):
        terms = [f"{_lit(H[r, j])} * kk[{j}, q]" for j in range(S) if H[r, j] != 0.0]
        L.append(f"                    c{r} = " + (" + ".join(terms) if terms else "0.0"))
    L += ["                    ys[i, js, q] = om * y[q] + th * (y1[q] + om * (c0 + th * (c1 + "
          "th * c2)))",
          "                js += 1",
          "            if last:",
          "                t = te",
          "            else:",
          "                t = t + h",
          f"            for q in range({n}):",
          "                y[q] = y1[q]",
          "            nacc += 1",
          "            e2 = e1",
          "            e1 = err_s",
          "            need_jac = True",
          "            if last:",
          f"                st = {OK}",
          "        else:",
          "            nrej += 1",
          "            if h_new < dt_min:",
          f"                st = {int(Status.STEP_TOO_SMALL)} if finite else {int(Status.NON_FINITE)}",
          "        h = h_new",
          f"        if st == {RUN} and nacc + nrej >= {int(spec.max_steps)}:",
          f"            st = {int(Status.MAX_STEPS)}",
          "    t_out[i] = t",
          "    status[i] = st",
          "    n_accepted[i] = nacc",
          "    n_rejected[i] = nrej",
          ""]
    if H.shape[0] != 3:
        raise ValueError("the dense-output formula needs exactly 3 H rows")
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
    if spec.n_params < 1:
        raise ValueError("n_params must be >= 1 (pad P = 0 with a dummy parameter)")
    if spec.has_args and spec.n_tv < 1:
        raise ValueError("args reach the kernel only as tables through a TableSplit (n_tv >= 1): "
                         "Enzyme's CUDA jvp cannot take an array argument")
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
    body = _emit_helpers(spec) + _emit_kernel(spec) + _emit_jac_kernel(spec)
    return "\n".join(head) + "\n" + lu_source_to_out_form(spec.lu_source) + "\n\n" + \
        "\n".join(body) + "\n"


def build_spec(n, n_params, has_args, max_steps, linear, jac_plan, tableau, controller,
               n_tv: int = 0) -> KernelSpec:
    """KernelSpec from a sparse :class:`LinearSolver` and a :class:`JacobianPlan` on its slots."""
    if linear.source is None:
        raise ValueError("the CUDA kernel needs the straight-line sparse LU (LinearSolver.source)")
    gi = np.asarray(jac_plan.gather_index)
    nc = jac_plan.n_colors
    slots = tuple((int(s), int(g // n), int(g % n)) for s, g in enumerate(gi) if g < nc * n)
    return KernelSpec(n=n, n_params=n_params, has_args=has_args, max_steps=int(max_steps),
                      lu_source=linear.source, nslots=int(linear.nslots),
                      diag_slots=tuple(int(d) for d in linear.diag_slots),
                      colors=tuple(int(c) for c in jac_plan.colors), n_colors=int(nc),
                      jac_slots=slots, tableau=tableau, controller=controller, n_tv=int(n_tv))
