"""The Rodas algorithm as kernel text, shared line for line by the plain and the sensitivity kernel.

One thread integrates one trajectory (``sens``: one (trajectory, direction) pair, z = [y, s]):
initial step (Hairer–Nørsett–Wanner), the stage loop unrolled with the tableau's literals (zero
coefficients dropped), the PID controller, dense output at the save times and the status codes, all
with the semantics of :func:`solver.backends.jax.ensemble.make_ensemble_solver`. One emitter writes
both kernels, so the sensitivity kernel's y block is the plain kernel's arithmetic exactly; the
``sens`` branches add the s block (module docstring of ``codegen.sensitivity``).
"""
from __future__ import annotations

from ....problem.status import Status
from .spec import KERNEL_ARGS, SENS_KERNEL_ARGS, KernelSpec, lit

__all__ = ["emit_kernel"]


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
    # the error weights: one row (1, n) for every trajectory or a row each (N, n), which the
    # sensitivity kernel's directions of a trajectory share
    L += ["    wt = weights[i if weights.shape[0] > 1 else 0]"]
    if nm.sens:
        L += ["    wt_s = weights_s[i if weights_s.shape[0] > 1 else 0]"]
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
    """The error norm of a (y, s) pair: the plain RMS (``wrms``), or the joint one
    (``wrms_joint``)."""
    if not nm.sens:
        return f"wrms({ey}, {ya}, {yb}, rtol, atol, wt, n_weighted)"
    return (f"wrms_joint({ey}, {es}, {ya}, {yb}, {sa}, {sb}, rtol, atol, atol_s, wt, "
            "wt_s, n_weighted)")


def _emit_initial_step(spec: KernelSpec, nm: _Names) -> list[str]:
    """Initial step (HNW I, §II.4), as the JAX backend's ``initial_step`` (of the joint system
    for sens)."""
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
          f"            h1 = (0.01 / dmax) ** {lit(1.0 / (tab.order + 1.0))}",
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
          f"        inv = 1.0 / (h * {lit(tab.gamma)})",
          f"        for s in range({spec.nslots}):" if not nm.sens else
          f"        for sl in range({spec.nslots}):",
          "            w[s] = -jv[s]" if not nm.sens else "            w[sl] = -jv[sl]"]
    for dg in spec.diag_slots:
        L.append(f"        w[{int(dg)}] = w[{int(dg)}] + inv")
    L.append("        lu_factor(w, lu)")
    return L


def _stage_updates(spec: KernelSpec, nm: _Names, st: int, ind: str):
    """Stage ``st``'s two vector updates with the tableau's literals (zero terms dropped): the
    stage point (yi[, si]) before the RHS, and the solve's right-hand side (yi[, si] with hd)
    after it; as in the unrolled form, so both forms do the same arithmetic."""
    tab, n = spec.tableau, spec.n
    sens = nm.sens
    a = [(lit(tab.a[st, j]), j) for j in range(st) if tab.a[st, j] != 0.0]
    point = [f"{ind}for q in range({n}):",
             f"{ind}    yi[q] = y[q]" + "".join(f" + {c} * kk[{j}, q]" for c, j in a)]
    if sens:
        point.append(f"{ind}    si[q] = s[q]" + "".join(f" + {c} * ks[{j}, q]" for c, j in a))

    def terms(kname, dname):
        out = ["hd * " + dname + "[q]"] if tab.d[st] != 0.0 else []
        return out + [f"({lit(tab.C[st, j])} / h) * {kname}[{j}, q]" for j in range(st)
                      if tab.C[st, j] != 0.0]

    rhs = [f"{ind}hd = h * {lit(tab.d[st])}"] if tab.d[st] != 0.0 else []
    rhs += [f"{ind}for q in range({n}):",
            f"{ind}    yi[q] = fi[q]" + "".join(f" + {e}" for e in terms("kk", "dfdt"))]
    sens_rhs = [f"{ind}for q in range({n}):",
                f"{ind}    si[q] = gi[q]" + "".join(f" + {e}" for e in terms("ks", "sdt"))
                + " + hu[q]"] if sens else []
    return point, rhs, sens_rhs


def _emit_stages_rolled(spec: KernelSpec, nm: _Names) -> list[str]:
    """Stage 0 as in the unrolled form; stages 1..S-1 as one loop in which the RHS, the
    triangular solves (and the sensitivity kernel's tangent and Hessian sweeps) appear once,
    while the cheap vector updates keep the tableau's literals in one branch per stage. The
    unrolled form inlines S copies of the RHS and of the sparse-LU solve; this one compiles in
    about half the time (docs/benchmarks.md)."""
    n, S, tab = spec.n, spec.tableau.stages, spec.tableau
    sens = nm.sens
    L = _emit_stages_range(spec, nm, 0, 1)
    L.append(f"        for sg in range(1, {S}):")
    for st in range(1, S):
        L.append(f"            {'if' if st == 1 else 'elif'} sg == {st}:")
        point, _, _ = _stage_updates(spec, nm, st, "                ")
        L += point + [f"                ts = t + {lit(tab.c[st])} * h"]
    L.append("            f_eval(yi, ts, p, args, fi)")
    if sens:
        L.append("            tan_eval(yi, si, ts, p, dp, args, da, gi)")
    for st in range(1, S):
        L.append(f"            {'if' if st == 1 else 'elif'} sg == {st}:")
        _, rhs, _ = _stage_updates(spec, nm, st, "                ")
        L += rhs
    L += ["            lu_solve(lu, yi, fi)",
          f"            for q in range({n}):",
          "                kk[sg, q] = fi[q]"]
    if sens:
        L.append("            hess_eval(y, s, fi, t, p, dp, args, da, hu)")
        for st in range(1, S):
            L.append(f"            {'if' if st == 1 else 'elif'} sg == {st}:")
            if tab.d[st] != 0.0:
                L.append(f"                hd = h * {lit(tab.d[st])}")
            L += _stage_updates(spec, nm, st, "                ")[2]
        L += ["            lu_solve(lu, si, gi)",
              f"            for q in range({n}):",
              "                ks[sg, q] = gi[q]"]
    return L


def _emit_stages(spec: KernelSpec, nm: _Names) -> list[str]:
    """The Rodas stages, unrolled with the tableau's literals (zero coefficients dropped)."""
    return _emit_stages_range(spec, nm, 0, spec.tableau.stages)


def _emit_stages_range(spec: KernelSpec, nm: _Names, first: int, stop: int) -> list[str]:
    """Stages ``first`` .. ``stop - 1``, unrolled with the tableau's literals.

    Sensitivity kernel, per stage: the y solve as in the plain kernel (W k = r), then the s
    block's exact staggered solve W k_s = r_s + H k (H k: one jvp of jvp at the step's start)."""
    tab, n, S = spec.tableau, spec.n, spec.tableau.stages
    sens = nm.sens
    L = []
    for st in range(first, stop):
        L.append(f"        # stage {st}")
        if st == 0:
            src, gsrc = "f0", "g0"
        else:
            a = [(lit(tab.a[st, j]), j) for j in range(st) if tab.a[st, j] != 0.0]
            L.append(f"        for q in range({n}):")
            L.append("            yi[q] = y[q]" + "".join(f" + {c} * kk[{j}, q]" for c, j in a))
            if sens:
                L.append("            si[q] = s[q]" + "".join(f" + {c} * ks[{j}, q]"
                                                            for c, j in a))
            tc = f"t + {lit(tab.c[st])} * h"
            L.append(f"        f_eval(yi, {tc}, p, args, fi)")
            if sens:
                L.append(f"        tan_eval(yi, si, {tc}, p, dp, args, da, gi)")
            src, gsrc = "fi", "gi"
        if tab.d[st] != 0.0:
            L.append(f"        hd = h * {lit(tab.d[st])}")

        def rhs_terms(kname, dname):
            terms = ["hd * " + dname + "[q]"] if tab.d[st] != 0.0 else []
            return terms + [f"({lit(tab.C[st, j])} / h) * {kname}[{j}, q]" for j in range(st)
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
    b = [(lit(tab.b[j]), j) for j in range(S) if tab.b[j] != 0.0]
    e = [(lit(tab.e[j]), j) for j in range(S) if tab.e[j] != 0.0]

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
    fac = [lit(ctrl.safety)]
    for base, beta in (("err_s", ctrl.beta1), ("e1", ctrl.beta2), ("e2", ctrl.beta3)):
        if beta != 0.0:
            fac.append(f"{base} ** {lit(-beta / k_ctrl)}")
    L += ["        if accept:",
          f"            fac = _nmin(_nmax({' * '.join(fac)}, {lit(ctrl.factor_min)}), "
          f"{lit(ctrl.factor_max)})",
          "        elif finite:",
          f"            fac = _nmin(_nmax({lit(ctrl.safety)} * err_s ** {lit(-1.0 / k_ctrl)}, "
          f"{lit(ctrl.factor_min)}), 1.0)",
          "        else:",
          f"            fac = {lit(ctrl.factor_min)}",
          "        h_new = h * fac",
          f"        dt_min = {lit(ctrl.dt_min_rel)} * _nmax(abs(t), 1.0)"]
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
            terms = [f"{lit(H[r, j])} * {kname}[{j}, q]" for j in range(S) if H[r, j] != 0.0]
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


def emit_kernel(spec: KernelSpec, sens: bool = False) -> list[str]:
    """The ensemble kernel: one trajectory per thread (``kernel``), or, with ``sens``, one
    (trajectory, sensitivity direction) per thread integrating z = [y, s] (``sens_kernel``)."""
    nm = _Names(sens)
    return (_emit_kernel_head(spec, nm) + _emit_initial_step(spec, nm)
            + _emit_step_matrix(spec, nm)
            + (_emit_stages_rolled(spec, nm) if spec.rolled_stages else _emit_stages(spec, nm))
            + _emit_error_control(spec, nm) + ["        if accept:"]
            + _emit_dense_output(spec, nm) + _emit_advance(spec, nm))


