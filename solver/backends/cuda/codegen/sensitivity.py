"""Source generator for the CUDA backend's forward-sensitivity kernel.

:func:`generate_sens_kernel_source` returns a second module with the same LU, ``f_eval`` and
``jac_eval`` as the plain kernel and ``sens_kernel(*SENS_KERNEL_ARGS)``: one thread per (trajectory
i, direction d), g = i * n_dir + d, integrating z = [y, s] with s' = Df(y, t, p, tv)[(s, 0, dp,
dtv)]. The y block is the plain kernel's text line for line (``codegen.rodas``); the s block adds,
per stage, the stage point ``si``, its rhs ``tan_eval`` (one ``jvp``) and the exact staggered solve
of the joint W = [[W, 0], [-H, W]]: ``W k_s = r_s + H k`` with ``H k`` = ``hess_eval`` (one
``jvp(jvp)``, the global ``jvp2_rhs``) at the step's start; once per step ``tan_dt_eval`` (∂s'/∂t,
one ``jvp(jvp)``). The error norm is ``wrms_joint`` (RMS_y² + RMS_s², s weights zero without
sensitivity error control -- then the thread's steps are exactly the plain kernel's).

Arguments: the plain kernel's plus ``s0`` (m, N, n), ``dparams`` (m, N, P), ``dargs`` (m or 1,
*args.shape; tangent tables, dtv = table_values(t, p, dargs[d])), ``atol_s``, ``weights_s``
((1 or N, n), as ``weights``: a trajectory's directions take its row), ``n_dir``; outputs ``ys``
(N, ns, n; written by direction 0), ``dys`` (m, N, ns, n) and per-thread
``t_out``, ``status``, ``n_accepted``, ``n_rejected`` (m, N). ``sens_probe_kernel`` evaluates s',
H u and ∂s'/∂t at given points (tests of the Enzyme calls).
"""
from __future__ import annotations

from .plain import emit_helpers
from .rodas import emit_kernel
from .spec import SENS_KERNEL_ARGS, KernelSpec, check_spec, lu_source_to_out_form

__all__ = ["generate_sens_kernel_source"]


def _zero_fill(name: str, size: int) -> list[str]:
    """A local array of literal zeros (a direction the compiler can see, so it folds)."""
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
    """Device functions of the sensitivity kernel (module docstring).

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
    ``sens_kernel`` (module docstring).  Same spec as the plain kernel:
    the y block is the plain kernel's arithmetic line for line."""
    check_spec(spec)
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
    body = emit_helpers(spec) + _emit_sens_helpers(spec) + emit_kernel(spec, sens=True) + \
        _emit_sens_probe_kernel(spec)
    return "\n".join(head) + "\n" + lu_source_to_out_form(spec.lu_source) + "\n\n" + \
        "\n".join(body) + "\n"


