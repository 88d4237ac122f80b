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

Sensitivity kernel (:func:`generate_sens_kernel_source`, issue 5, DESIGN §8): a second module with
the same LU, ``f_eval`` and ``jac_eval`` and ``sens_kernel(*SENS_KERNEL_ARGS)``: one thread per
(trajectory i, direction d), g = i * n_dir + d, integrating z = [y, s] with
s' = Df(y, t, p, tv)[(s, 0, dp, dtv)].  The y block is the plain kernel's text line for line (one
emitter, ``_emit_kernel(spec, sens)``, writes both); the s block adds, per stage, the stage point
``si``, its rhs ``tan_eval`` (one ``jvp``) and the exact staggered solve of the joint
W = [[W, 0], [-H, W]]: ``W k_s = r_s + H k`` with ``H k`` = ``hess_eval`` (one ``jvp(jvp)``, the
global ``jvp2_rhs``) at the step's start; once per step ``tan_dt_eval`` (∂s'/∂t, one ``jvp(jvp)``).
The error norm is ``wrms_joint`` (RMS_y² + RMS_s², s weights zero without sensitivity error
control -- then the thread's steps are exactly the plain kernel's).  Arguments: the plain kernel's
plus ``s0`` (m, N, n), ``dparams`` (m, N, P), ``dargs`` (m or 1, *args.shape; tangent tables,
dtv = table_values(t, p, dargs[d])), ``atol_s``, ``weights_s`` (n,), ``n_dir``; outputs ``ys``
(N, ns, n; written by direction 0), ``dys`` (m, N, ns, n) and per-thread ``t_out``, ``status``,
``n_accepted``, ``n_rejected`` (m, N).  ``sens_probe_kernel`` evaluates s', H u and ∂s'/∂t at given
points (tests of the Enzyme calls).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from .status import Status

__all__ = ["KernelSpec", "generate_kernel_source", "generate_sens_kernel_source",
           "lu_source_to_out_form", "MAX_DIRECTIONS", "KERNEL_ARGS", "SENS_KERNEL_ARGS"]

#: numba-enzyme-cuda accepts at most this many direction sets in one ``jvp`` call.
MAX_DIRECTIONS = 8

#: The kernel's positional arguments, in order (the backend and the emulator both use it).
KERNEL_ARGS = ("y0", "t0", "t_end", "t_save", "params", "args", "rtol", "atol", "weights", "h0",
               "n_weighted", "ys", "t_out", "status", "n_accepted", "n_rejected", "n_traj")

#: The sensitivity kernel's positional arguments (module docstring, "Sensitivity kernel").
SENS_KERNEL_ARGS = ("y0", "t0", "t_end", "t_save", "params", "args", "s0", "dparams", "dargs",
                    "rtol", "atol", "atol_s", "weights", "weights_s", "h0", "n_weighted", "ys",
                    "dys", "t_out", "status", "n_accepted", "n_rejected", "n_traj", "n_dir")


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


def _zero_fill(name: str, size: int) -> list[str]:
    """A local array of literal zeros (a direction the compiler can see folds, DESIGN §5)."""
    return [f"    {name} = cuda.local.array({size}, F64)"] + \
        [f"    {name}[{q}] = 0.0" for q in range(size)]


def _table_locals(T: int, pairs) -> list[str]:
    """Local copies of table lookups: ``pairs`` = ((local name, lookup call), ...); the lookups
    run outside Enzyme (plain device functions reading an array)."""
    L = []
    for name, call in pairs:
        L += [f"    {name}t = {call}", f"    {name} = cuda.local.array({T}, F64)"]
        L += [f"    {name}[{q}] = {name}t[{q}]" for q in range(T)]
    return L


def _emit_sens_helpers(spec: KernelSpec) -> list[str]:
    """Device functions of the sensitivity kernel (module docstring, "Sensitivity kernel").

    * ``wsq`` / ``wrms_joint``: the error norm of z = [y, s] as the JAX backend's joint solve
      weights it (each block's RMS, joint error² = sum of the blocks' RMS²; s weights zero
      give exactly the plain norm);
    * ``tan_eval``: s' = Df[(s, 0, dp, dtv)] -- one jvp;
    * ``hess_eval``: H u = D²f[(s, 0, dp, dtv), (u, 0, 0, 0)] -- one jvp of jvp;
    * ``tan_dt_eval``: ∂s'/∂t = D²f[(s, 0, dp, dtv), (0, 1, 0, tv')] + Df[(0, 0, 0, dtv')] --
      one jvp of jvp (its second direction set carries the tangent table's t-derivative).

    The jvp-of-jvp call layout (numba-enzyme-cuda ``jvp(jvp(f))``, one sweep): ``(out, x, d1,
    ox, od)`` where x and d1 are the inner jvp's primal and direction (4 argument groups each
    mirroring the primal's ``y, t, p[, tv]``) and (ox, od) the outer direction on both; the
    result is D²f[d1, ox] + Df[od].
    """
    n, P, T = spec.n, spec.n_params, spec.n_tv
    L = [
        "def wsq(e, ya, yb, rtol, atol, wt):",
        "    # the sum of squares of wrms (same loop, same rounding)",
        "    acc = 0.0",
        f"    for q in range({n}):",
        "        sc = atol[q] + rtol * _nmax(abs(ya[q]), abs(yb[q]))",
        "        r = wt[q] * e[q] / sc",
        "        acc += r * r",
        "    return acc",
        "",
        "def wrms_joint(ey, es, ya, yb, sa, sb, rtol, atol, atol_s, wt, wt_s, nw):",
        "    return math.sqrt((wsq(ey, ya, yb, rtol, atol, wt) + wsq(es, sa, sb, rtol, atol_s, "
        "wt_s)) / nw)",
        "",
    ]
    tv_pairs = [("tv", "table_values(t, p, args)"), ("dtv", "table_values(t, p, da)")]
    inner = "y, t, p, tv, s, 0.0, dp, dtv" if T else "y, t, p, s, 0.0, dp"
    ztv = ", ztv" if T else ""
    # s' (one jvp)
    L += ["def tan_eval(y, s, t, p, dp, args, da, out):",
          "    # s' = Df(y, t, p, tv)[(s, 0, dp, dtv)], dtv = the tangent table's values"]
    if T:
        L += _table_locals(T, tv_pairs)
    L += [f"    jvp_rhs(out, {inner})", ""]
    # H u (one jvp of jvp)
    L += ["def hess_eval(y, s, u, t, p, dp, args, da, out):",
          "    # H u = d/de [s'(y + e u, s)]: the joint Jacobian's (s, y) block times u"]
    L += _zero_fill("zy", n) + _zero_fill("zp", P) + (_zero_fill("ztv", T) if T else [])
    if T:
        L += _table_locals(T, tv_pairs)
    L += [f"    jvp2_rhs(out, {inner}, u, 0.0, zp{ztv}, zy, 0.0, zp{ztv})", ""]
    # ∂s'/∂t (one jvp of jvp)
    L += ["def tan_dt_eval(y, s, t, p, dp, args, da, out):",
          "    # d s'/dt at fixed (y, s): through t, tv(t) and the tangent table dtv(t)"]
    L += _zero_fill("zy", n) + _zero_fill("zp", P)
    if T:
        L += _table_locals(T, tv_pairs + [("tvdt", "table_values_dt(t, p, args)"),
                                          ("dtvdt", "table_values_dt(t, p, da)")])
        L += [f"    jvp2_rhs(out, {inner}, zy, 1.0, zp, tvdt, zy, 0.0, zp, dtvdt)", ""]
    else:
        L += [f"    jvp2_rhs(out, {inner}, zy, 1.0, zp, zy, 0.0, zp)", ""]
    return L


class _Names:
    """What the kernel text calls things: the plain kernel and the sensitivity kernel (``sens``)
    share every line of the Rodas algorithm; the sensitivity kernel adds the s-block lines and
    indexes its per-thread outputs by (direction d, trajectory i)."""

    def __init__(self, sens: bool):
        self.sens = sens
        self.out = "d, i" if sens else "i"   # index of t_out / status / step counters


def _emit_kernel_head(spec: KernelSpec, nm: _Names) -> list[str]:
    """Signature, thread index, local arrays, loads and the save times at or before t0."""
    n, P, S = spec.n, spec.n_params, spec.tableau.stages
    if nm.sens:
        L = ["def sens_kernel(" + ", ".join(SENS_KERNEL_ARGS) + "):",
             "    g = cuda.grid(1)",
             "    if g >= n_traj * n_dir:",
             "        return",
             "    # thread g = (trajectory i, direction d): a trajectory's directions are adjacent",
             "    i = g // n_dir",
             "    d = g - i * n_dir",
             "    # tangent tables: one per direction, or one all-zero table for every direction",
             "    da = dargs[d if dargs.shape[0] == n_dir else 0]"]
    else:
        L = ["def kernel(" + ", ".join(KERNEL_ARGS) + "):",
             "    i = cuda.grid(1)",
             "    if i >= n_traj:",
             "        return"]
    L += [f"    y = cuda.local.array({n}, F64)",
          f"    y1 = cuda.local.array({n}, F64)",
          f"    yi = cuda.local.array({n}, F64)",
          f"    fi = cuda.local.array({n}, F64)",
          f"    f0 = cuda.local.array({n}, F64)",
          f"    dfdt = cuda.local.array({n}, F64)",
          f"    kk = cuda.local.array(({S}, {n}), F64)",
          f"    jv = cuda.local.array({spec.nslots}, F64)",
          f"    w = cuda.local.array({spec.nslots}, F64)",
          f"    lu = cuda.local.array({spec.nslots}, F64)",
          f"    p = cuda.local.array({P}, F64)"]
    if nm.sens:
        # s-block twins of y, y1, yi, fi, f0, dfdt, kk; hu = H u of a stage
        L += [f"    {v} = cuda.local.array({n}, F64)" for v in ("s", "s1", "si", "gi", "g0",
                                                                   "sdt", "hu")]
        L += [f"    ks = cuda.local.array(({S}, {n}), F64)",
              f"    dp = cuda.local.array({P}, F64)"]
    L += [f"    for q in range({P}):",
          "        p[q] = params[i, q]"]
    if nm.sens:
        L.append("        dp[q] = dparams[d, i, q]")
    L += [f"    for q in range({n}):",
          "        y[q] = y0[i, q]"]
    if nm.sens:
        L.append("        s[q] = s0[d, i, q]")
    L += ["    t = t0[i]",
          "    te = t_end[i]",
          "    m = t_save.shape[1]",
          "    # save times at or before t0 get y0; the others NaN until a step passes them",
          "    js = 0",
          "    for j in range(m):",
          "        if t_save[i, j] <= t:"]
    L += _emit_store(spec, nm, "            ", "ys[i, j, q] = y[q]", "dys[d, i, j, q] = s[q]")
    L += ["            js = j + 1",
          "        else:"]
    L += _emit_store(spec, nm, "            ", "ys[i, j, q] = math.nan",
                     "dys[d, i, j, q] = math.nan")
    return L


def _emit_store(spec: KernelSpec, nm: _Names, ind: str, y_stmt: str, s_stmt: str) -> list[str]:
    """A loop storing one saved y row (the sensitivity kernel: ys from direction 0 only, every
    direction its own dys row)."""
    n = spec.n
    if not nm.sens:
        return [f"{ind}for q in range({n}):", f"{ind}    {y_stmt}"]
    return [f"{ind}for q in range({n}):",
            f"{ind}    if d == 0:",
            f"{ind}        {y_stmt}",
            f"{ind}    {s_stmt}"]


def _norm(nm: _Names, ey: str, es: str, ya: str, yb: str, sa: str, sb: str) -> str:
    """The error norm of a (y, s) pair: the plain RMS, or the joint one (module docstring)."""
    if not nm.sens:
        return f"wrms({ey}, {ya}, {yb}, rtol, atol, weights, n_weighted)"
    return (f"wrms_joint({ey}, {es}, {ya}, {yb}, {sa}, {sb}, rtol, atol, atol_s, weights, "
            "weights_s, n_weighted)")


def _emit_initial_step(spec: KernelSpec, nm: _Names) -> list[str]:
    """Initial step (HNW I, §II.4), as jax_backend.initial_step (of the joint system for sens)."""
    n, tab = spec.n, spec.tableau
    sens = nm.sens
    L = ["    span = te - t",
         "    hh = h0[i]",
         "    if hh != hh:",
         "        f_eval(y, t, p, args, f0)"]
    if sens:
        L.append("        tan_eval(y, s, t, p, dp, args, da, g0)")
    L += [f"        d0 = {_norm(nm, 'y', 's', 'y', 'y', 's', 's')}",
          f"        d1 = {_norm(nm, 'f0', 'g0', 'y', 'y', 's', 's')}",
          "        if d0 < 1e-5 or d1 < 1e-5:",
          "            hs = 1e-6",
          "        else:",
          "            hs = 0.01 * d0 / d1",
          "        hs = _nmin(hs, span)",
          f"        for q in range({n}):",
          "            yi[q] = y[q] + hs * f0[q]"]
    if sens:
        L.append("            si[q] = s[q] + hs * g0[q]")
    L.append("        f_eval(yi, t + hs, p, args, fi)")
    if sens:
        L.append("        tan_eval(yi, si, t + hs, p, dp, args, da, gi)")
    L += [f"        for q in range({n}):",
          "            fi[q] = fi[q] - f0[q]"]
    if sens:
        L.append("            gi[q] = gi[q] - g0[q]")
    L += [f"        d2 = {_norm(nm, 'fi', 'gi', 'y', 'y', 's', 's')} / hs",
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
          "        hh = _nmin(hh, span)"]
    return L


def _emit_step_matrix(spec: KernelSpec, nm: _Names) -> list[str]:
    """Loop head, f/J/df/dt at a new point, W = I/(hγ) − J and its LU (shared by both blocks:
    the joint W is [[W, 0], [−H, W]], so the s block needs no factorisation of its own)."""
    tab = spec.tableau
    RUN, OK = int(Status.RUNNING), int(Status.OK)
    L = ["    h = hh",
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
         "            jac_eval(y, t, p, args, jv, dfdt)"]
    if nm.sens:
        L += ["            # the s block's rhs and its t-derivative at (y, s, t)",
              "            tan_eval(y, s, t, p, dp, args, da, g0)",
              "            tan_dt_eval(y, s, t, p, dp, args, da, sdt)"]
    L += ["            need_jac = False",
          f"        inv = 1.0 / (h * {_lit(tab.gamma)})",
          f"        for s in range({spec.nslots}):" if not nm.sens else
          f"        for sl in range({spec.nslots}):",
          "            w[s] = -jv[s]" if not nm.sens else "            w[sl] = -jv[sl]"]
    for dg in spec.diag_slots:
        L.append(f"        w[{int(dg)}] = w[{int(dg)}] + inv")
    L.append("        lu_factor(w, lu)")
    return L


def _emit_stages(spec: KernelSpec, nm: _Names) -> list[str]:
    """The Rodas stages, unrolled with the tableau's literals (zero coefficients dropped).

    Sensitivity kernel, per stage: the y solve as in the plain kernel (W k = r), then the s
    block's exact staggered solve W k_s = r_s + H k (H k: one jvp of jvp at the step's start)."""
    tab, n, S = spec.tableau, spec.n, spec.tableau.stages
    sens = nm.sens
    L = []
    for st in range(S):
        L.append(f"        # stage {st}")
        if st == 0:
            src, gsrc = "f0", "g0"
        else:
            a = [(_lit(tab.a[st, j]), j) for j in range(st) if tab.a[st, j] != 0.0]
            L.append(f"        for q in range({n}):")
            L.append("            yi[q] = y[q]" + "".join(f" + {c} * kk[{j}, q]" for c, j in a))
            if sens:
                L.append("            si[q] = s[q]" + "".join(f" + {c} * ks[{j}, q]"
                                                            for c, j in a))
            tc = f"t + {_lit(tab.c[st])} * h"
            L.append(f"        f_eval(yi, {tc}, p, args, fi)")
            if sens:
                L.append(f"        tan_eval(yi, si, {tc}, p, dp, args, da, gi)")
            src, gsrc = "fi", "gi"
        if tab.d[st] != 0.0:
            L.append(f"        hd = h * {_lit(tab.d[st])}")

        def rhs_terms(kname, dname):
            terms = ["hd * " + dname + "[q]"] if tab.d[st] != 0.0 else []
            return terms + [f"({_lit(tab.C[st, j])} / h) * {kname}[{j}, q]" for j in range(st)
                            if tab.C[st, j] != 0.0]

        L.append(f"        for q in range({n}):")
        L.append(f"            yi[q] = {src}[q]" + "".join(f" + {e}"
                                                           for e in rhs_terms("kk", "dfdt")))
        L.append("        lu_solve(lu, yi, fi)")
        L.append(f"        for q in range({n}):")
        L.append(f"            kk[{st}, q] = fi[q]")
        if sens:
            L += ["        hess_eval(y, s, fi, t, p, dp, args, da, hu)",
                  f"        for q in range({n}):",
                  f"            si[q] = {gsrc}[q]" + "".join(f" + {e}" for e in
                                                          rhs_terms("ks", "sdt")) + " + hu[q]",
                  "        lu_solve(lu, si, gi)",
                  f"        for q in range({n}):",
                  f"            ks[{st}, q] = gi[q]"]
    return L


def _emit_error_control(spec: KernelSpec, nm: _Names) -> list[str]:
    """New solution, embedded error, accept/reject and the PID factor (literal exponents)."""
    tab, ctrl, n, S = spec.tableau, spec.controller, spec.n, spec.tableau.stages
    k_ctrl = tab.embedded_order + 1.0
    b = [(_lit(tab.b[j]), j) for j in range(S) if tab.b[j] != 0.0]
    e = [(_lit(tab.e[j]), j) for j in range(S) if tab.e[j] != 0.0]

    def comb(coefs, kname):
        return " + ".join(f"{c} * {kname}[{j}, q]" for c, j in coefs) if coefs else "0.0"

    L = [f"        for q in range({n}):",
         "            y1[q] = y[q]" + "".join(f" + {c} * kk[{j}, q]" for c, j in b),
         "            yi[q] = " + comb(e, "kk")]
    if nm.sens:
        L += ["            s1[q] = s[q]" + "".join(f" + {c} * ks[{j}, q]" for c, j in b),
              "            si[q] = " + comb(e, "ks")]
    L += [f"        err = {_norm(nm, 'yi', 'si', 'y', 'y1', 's', 's1')}",
          "        finite = _isfin(err)",
          f"        for q in range({n}):",
          "            if not _isfin(y1[q]):",
          "                finite = False"]
    if nm.sens:
        L += ["            if not _isfin(s1[q]):",
              "                finite = False"]
    L += ["        accept = finite and err <= 1.0",
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
          f"        dt_min = {_lit(ctrl.dt_min_rel)} * _nmax(abs(t), 1.0)"]
    return L


def _emit_dense_output(spec: KernelSpec, nm: _Names) -> list[str]:
    """Dense output at the save times an accepted step passed (the method's own interpolant)."""
    tab, n, S = spec.tableau, spec.n, spec.tableau.stages
    H = tab.H
    if H.shape[0] != 3:
        raise ValueError("the dense-output formula needs exactly 3 H rows")

    def block(kname, ind):
        out = []
        for r in range(H.shape[0]):
            terms = [f"{_lit(H[r, j])} * {kname}[{j}, q]" for j in range(S) if H[r, j] != 0.0]
            out.append(f"{ind}c{r} = " + (" + ".join(terms) if terms else "0.0"))
        return out

    interp = "om * {0}[q] + th * ({1}[q] + om * (c0 + th * (c1 + th * c2)))"
    L = ["            # dense output for the save times this step passed",
         "            while js < m and (t_save[i, js] <= t + h or last):",
         "                th = (t_save[i, js] - t) / h",
         "                om = 1.0 - th"]
    if not nm.sens:
        L += [f"                for q in range({n}):"] + block("kk", "                    ")
        L += ["                    ys[i, js, q] = " + interp.format("y", "y1")]
    else:
        L += ["                if d == 0:",
              f"                    for q in range({n}):"] + block("kk", "                        ")
        L += ["                        ys[i, js, q] = " + interp.format("y", "y1"),
              f"                for q in range({n}):"] + block("ks", "                    ")
        L += ["                    dys[d, i, js, q] = " + interp.format("s", "s1")]
    L.append("                js += 1")
    return L


def _emit_advance(spec: KernelSpec, nm: _Names) -> list[str]:
    """Accept (advance t, y[, s]) or reject; statuses; the per-thread results."""
    n = spec.n
    OK, RUN = int(Status.OK), int(Status.RUNNING)
    L = ["            if last:",
         "                t = te",
         "            else:",
         "                t = t + h",
         f"            for q in range({n}):",
         "                y[q] = y1[q]"]
    if nm.sens:
        L.append("                s[q] = s1[q]")
    L += ["            nacc += 1",
          "            e2 = e1",
          "            e1 = err_s",
          "            need_jac = True",
          "            if last:",
          f"                st = {OK}",
          "        else:",
          "            nrej += 1",
          "            if h_new < dt_min:",
          f"                st = {int(Status.STEP_TOO_SMALL)} if finite else "
          f"{int(Status.NON_FINITE)}",
          "        h = h_new",
          f"        if st == {RUN} and nacc + nrej >= {int(spec.max_steps)}:",
          f"            st = {int(Status.MAX_STEPS)}",
          f"    t_out[{nm.out}] = t",
          f"    status[{nm.out}] = st",
          f"    n_accepted[{nm.out}] = nacc",
          f"    n_rejected[{nm.out}] = nrej",
          ""]
    return L


def _emit_kernel(spec: KernelSpec, sens: bool = False) -> list[str]:
    """The ensemble kernel: one trajectory per thread (``kernel``), or, with ``sens``, one
    (trajectory, sensitivity direction) per thread integrating z = [y, s] (``sens_kernel``)."""
    nm = _Names(sens)
    return (_emit_kernel_head(spec, nm) + _emit_initial_step(spec, nm)
            + _emit_step_matrix(spec, nm) + _emit_stages(spec, nm)
            + _emit_error_control(spec, nm) + ["        if accept:"]
            + _emit_dense_output(spec, nm) + _emit_advance(spec, nm))


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
    _check_spec(spec)
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


def _check_spec(spec: KernelSpec) -> None:
    """What every generated kernel needs of its spec (plain and sensitivity kernels alike)."""
    if spec.n_params < 1:
        raise ValueError("n_params must be >= 1 (pad P = 0 with a dummy parameter)")
    if spec.has_args and spec.n_tv < 1:
        raise ValueError("args reach the kernel only as tables through a TableSplit (n_tv >= 1): "
                         "Enzyme's CUDA jvp cannot take an array argument")


def _emit_sens_probe_kernel(spec: KernelSpec) -> list[str]:
    """A test kernel: s' (tan_eval), H u (hess_eval) and ∂s'/∂t (tan_dt_eval) at given points,
    one point per thread, through the same device code (checks the Enzyme jvp(jvp) layout)."""
    n, P = spec.n, spec.n_params
    L = ["def sens_probe_kernel(y_in, s_in, u_in, t_in, params, dparams, args, dargs, g_out, "
         "hu_out, sdt_out, n_traj):",
         "    i = cuda.grid(1)",
         "    if i >= n_traj:",
         "        return",
         "    da = dargs[i if dargs.shape[0] == n_traj else 0]"]
    L += [f"    {v} = cuda.local.array({n}, F64)" for v in ("y", "s", "u", "g", "hu", "sdt")]
    L += [f"    p = cuda.local.array({P}, F64)",
          f"    dp = cuda.local.array({P}, F64)",
          f"    for q in range({P}):",
          "        p[q] = params[i, q]",
          "        dp[q] = dparams[i, q]",
          f"    for q in range({n}):",
          "        y[q] = y_in[i, q]",
          "        s[q] = s_in[i, q]",
          "        u[q] = u_in[i, q]",
          "    tan_eval(y, s, t_in[i], p, dp, args, da, g)",
          "    hess_eval(y, s, u, t_in[i], p, dp, args, da, hu)",
          "    tan_dt_eval(y, s, t_in[i], p, dp, args, da, sdt)",
          f"    for q in range({n}):",
          "        g_out[i, q] = g[q]",
          "        hu_out[i, q] = hu[q]",
          "        sdt_out[i, q] = sdt[q]",
          ""]
    return L


def generate_sens_kernel_source(spec: KernelSpec) -> str:
    """The sensitivity module's text: LU, ``f_eval``/``jac_eval``, the s-block helpers and
    ``sens_kernel`` (module docstring, "Sensitivity kernel").  Same spec as the plain kernel:
    the y block is the plain kernel's arithmetic line for line."""
    _check_spec(spec)
    tables = ("dargs: (m or 1, *args.shape) tangent tables (one all-zero table when the tables "
              "are not differentiated); dtv = table_values(t, p, dargs[d]).") if spec.n_tv else \
        "args, dargs: unused float64 dummies of shapes (1,) and (1, 1)."
    head = [f'"""Generated Rodas forward-sensitivity kernel: n={spec.n}, P={spec.n_params}, '
            f'nslots={spec.nslots}, colours={spec.n_colors}, tableau={spec.tableau.name}.',
            "",
            "sens_kernel(" + ", ".join(SENS_KERNEL_ARGS) + "):",
            "one (trajectory i, direction d) per thread, g = i * n_dir + d, integrating z = [y, s]",
            "with s' = Df(y, t, p, tv)[(s, 0, dp, dtv)]; the joint W = [[W, 0], [-H, W]] is solved",
            "exactly, staggered: W k = r, then W k_s = r_s + H k (H k by one jvp of jvp).",
            tables,
            '"""',
            "import math", ""]
    body = _emit_helpers(spec) + _emit_sens_helpers(spec) + _emit_kernel(spec, sens=True) + \
        _emit_sens_probe_kernel(spec)
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
