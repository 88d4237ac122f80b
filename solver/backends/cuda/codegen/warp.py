"""The warp kernels: one trajectory per warp of ``lanes`` threads (``kernel``), or one
trajectory and up to ``dir_warps`` of its tangent directions per block, a warp per direction
(``sens_kernel``), for linear right-hand sides.

Why: one trajectory per thread keeps a step's whole chain of dependent operations -- the RHS, the
Jacobian, the sparse LU and eight triangular solves on ~60 kB of local memory -- in one thread;
for the EB model that is ≈ 1.3 ms a step, whatever the GPU's width.  A linear rhs f = J(t) y
(``rhs.linear_jacobian``) lets the lanes split all of it:

* J's entries are sums of constant multiples of M monomials of a few dozen atoms
  (``solver.linalg.entry_terms``): every lane computes the monomials (``warp_entries``), then
  its own rows' entries and their share of f = J y;
* W = I/(hγ) − J is factored level by level, U scaled to unit upper, and every stage's two
  triangular solves run as column-oriented update levels (``warp_schedule``), in shared memory,
  on an elimination order chosen for few levels (``ordering="depth"``), a ``syncwarp`` between
  levels; the text of each phase is straight-line (``warp_writer``);
* stage vectors, f and ∂f/∂t live in each lane's local memory for its owned rows; the error
  norm is a reduction through shared memory (shuffles are avoided: numba-cuda-mlir 0.5.4 rounds
  a float64 shuffle through float32).

The sensitivity kernel integrates z = [y, s] with s' = J s + J_θ y, J_θ the entries' derivative
along the direction (dp, tangent table): the same terms over the monomials' directional
derivatives.  The joint W = [[W, 0], [−J_θ, W]] is solved exactly with W's one factorisation:
W k = r, then W k_s = r_s + J_θ(t_n) k (the staggered direct method), as the thread kernel does.
The block's directions share y and W: its warp 0 (``P0``) alone carries y -- f, J into W, the
factorisation, every stage's W k = r -- and leaves them in shared memory; every warp then solves
its own direction's W k_s (``__syncthreads`` where the primal's results pass to the others: after
each stage point and each primal solve).  Per step that is one factorisation and one primal solve
a stage for the block instead of one per direction.  The block takes one step sequence: its
error norm sums y's and all its directions' (RMS_y² + Σ_d RMS_s_d², the JAX joint solve's
convention over the block's directions), reduced warp by warp in warp order so every lane gets
the same bits.  The host pads the directions with zero ones to fill the last block (a zero
direction adds exactly nothing to the norm).

The algorithm -- initial step, Rodas stages (rolled: the tableau's literals in one branch a
stage), PID controller, dense output, statuses, the joint error norm -- is the thread kernel's
(``codegen.rodas``, ``codegen.sensitivity``), so results equal the JAX backend's to rounding.
The monomials at t_n are kept apart from those of the stages (re-evaluated only where the stage
time changes: Rodas5P's last three stages share t + h), so a rejected step re-evaluates nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

from ....problem.status import Status
from .spec import KERNEL_ARGS, SENS_KERNEL_ARGS, lit
from .warp_writer import BSYNC, SYNC, Writer, field

__all__ = ["WarpSpec", "WARP_KERNEL_ARGS", "WARP_SENS_KERNEL_ARGS", "generate_warp_source",
           "SYNC"]

#: the warp kernels' positional arguments: the thread kernels', then the schedule's tables
WARP_KERNEL_ARGS = KERNEL_ARGS + ("sched", "sched_f")
WARP_SENS_KERNEL_ARGS = SENS_KERNEL_ARGS + ("sched", "sched_f")


@dataclass(frozen=True)
class WarpSpec:
    """What the warp kernels' text depends on (tolerances and arrays are arguments)."""

    n: int
    n_params: int
    n_tv: int
    m: int                    # declared Jacobian entries
    n_mono: int               # monomials of the entries
    max_steps: int
    tableau: object
    controller: object
    schedule: object          # warp_schedule.WarpSchedule
    mono_source: str          # warp_entries.monomial_functions
    dir_warps: int = 1        # direction warps a sensitivity block holds at most

    @staticmethod
    def sens_bytes(n: int, nslots: int, lanes: int, m: int, n_mono: int, dir_warps: int) -> int:
        """Static shared memory of one sensitivity block: the primal's LU slots, vectors and
        entries once, each direction warp's vectors, reduction row and monomials."""
        n1 = n + 1
        return 8 * (nslots + 2 + 3 * n1 + m + 1
                    + dir_warps * (3 * n1 + lanes + 1 + 6 * n_mono))

    @property
    def lanes(self) -> int:
        return self.schedule.lanes

    @property
    def nslots(self) -> int:
        return self.schedule.nslots

    def shared_bytes(self, sens: bool = False) -> int:
        """Static shared memory of one block: a plain block is one warp, a sensitivity block
        ``dir_warps`` warps."""
        if sens:
            return self.sens_bytes(self.n, self.nslots, self.lanes, self.m, self.n_mono,
                                   self.dir_warps)
        return 8 * (self.nslots + 2 + 3 * (self.n + 1) + self.lanes + self.m + 1
                    + 3 * self.n_mono)


class _Names:
    """The variables that differ between the plain and the sensitivity kernel."""

    def __init__(self, w: Writer):
        M = w.s.n_mono
        self.out = "d, i" if w.sens else "i"
        self.dx = 2 * M if w.sens else M          # dG/dx in sh_g (dG/dθ at M with sens)


def _rhs_s(w: Writer, q: int, vy: str, vs: str, g: str, th: int, out: str, dx=None):
    """Lines: ``out`` = row q of J s + J_θ y (monomials in ``g``: G at 0, dG/dθ at ``th``; with
    ``dx`` = (offset of dG/dx, offset of d²G/dθdx): the same for ∂/∂t)."""
    g0, g1 = (0, th) if dx is None else dx
    return (w.entries(q, vs, out, g=g, mono0=g0)
            + w.entries(q, vy, out, g=g, mono0=g1, add=True))


def _head(w: Writer):
    s, K, n, sens = w.s, w.K, w.n, w.sens
    S, M = s.tableau.stages, s.n_mono
    n1, NW = n + 1, s.dir_warps
    if sens:
        w(0, "def sens_kernel(" + ", ".join(WARP_SENS_KERNEL_ARGS) + "):")
        # a block is one trajectory and nw <= dir_warps of its directions, a warp each; warp 0
        # (P0) also carries the state y, its factorisation and its stage solves
        w(1, "Lb = U64(cuda.threadIdx.x)", f"L = Lb % U64({s.lanes})",
          f"Wp = Lb // U64({s.lanes})", f"nw = U64(cuda.blockDim.x) // U64({s.lanes})",
          "P0 = Wp == U64(0)", f"NWU = U64({NW})")
    else:
        w(0, "def kernel(" + ", ".join(WARP_KERNEL_ARGS) + "):")
        w(1, "L = U64(cuda.threadIdx.x)")
    w(1, f"sh_l = cuda.shared.array({s.nslots + 2}, F64)")
    vecs = ["sh_y", "sh_yi", "sh_x"]
    w(1, *[f"{v} = cuda.shared.array({n1}, F64)" for v in vecs])
    warp_vecs = ["sh_s", "sh_si", "sh_xs"] if sens else []
    w(1, *[f"{v} = cuda.shared.array({NW * n1}, F64)" for v in warp_vecs])
    w(1, f"sh_r = cuda.shared.array({(NW if sens else 1) * s.lanes}, F64)",
      f"sh_j = cuda.shared.array({s.m + 1}, F64)",
      f"sh_g = cuda.shared.array({(4 * NW if sens else 2) * M}, F64)",
      f"sh_gs = cuda.shared.array({(2 * NW if sens else 1) * M}, F64)")
    if sens:
        # n_dir: the directions, padded by the host to a multiple of nw
        w(1, f"sh_t = cuda.shared.array({NW}, F64)",
          f"nwi = cuda.blockDim.x // {s.lanes}", "ng = n_dir // nwi", "gb = cuda.blockIdx.x",
          "if gb >= n_traj * ng:", "    return", "i = gb // ng",
          f"d = (gb - i * ng) * nwi + cuda.threadIdx.x // {s.lanes}",
          "da = dargs[d if dargs.shape[0] == n_dir else 0]",
          # the error weights: one row (1, n) for every trajectory or a row each (N, n),
          # which the trajectory's directions share
          "wt = weights[i if weights.shape[0] > 1 else 0]",
          "wt_s = weights_s[i if weights_s.shape[0] > 1 else 0]")
    else:
        w(1, "i = cuda.blockIdx.x", "if i >= n_traj:", "    return",
          # the error weights: one row for every trajectory (1, n), or a row each (N, n)
          "wt = weights[i if weights.shape[0] > 1 else 0]")
    w(1, "M16 = U64(65535)", "S16 = U64(16)")
    for q in range(K):
        w(1, f"r{q} = {field(w.ws.own_row[q])}", f"p{q} = {field(w.ws.own_pos[q])}",
          f"dg{q} = {field(w.ws.own_diag[q])}")
    w(1, "if L == U64(0):")
    w(2, *w.primal([f"sh_l[{w.ws.scratch}] = 0.0", f"sh_l[{w.ws.zero}] = 0.0",
                    *[f"{v}[{n}] = 0.0" for v in vecs], f"sh_j[{s.m}] = 0.0"]),
      *[f"{w.ix(v, f'U64({n})')} = 0.0" for v in warp_vecs])
    locs = ["f0", "dt", "y1"] + (["g0", "sdt", "s1", "rs"] if sens else [])
    w(1, f"p = cuda.local.array({s.n_params}, F64)", f"kk = cuda.local.array({S * K}, F64)",
      *[f"{v} = cuda.local.array({K}, F64)" for v in locs])
    if sens:
        w(1, f"ks = cuda.local.array({S * K}, F64)", f"dp = cuda.local.array({s.n_params}, F64)")
    w(1, f"for q in range({s.n_params}):", "    p[q] = params[i, q]")
    if sens:
        w(1, "    dp[q] = dparams[d, i, q]")
    w.rows(1, lambda q: w.primal([f"sh_y[r{q}] = y0[i, r{q}]"])
           + ([f"{w.ix('sh_s', f'r{q}')} = s0[d, i, r{q}]"] if sens else []))
    w(1, "t = t0[i]", "te = t_end[i]", "m = t_save.shape[1]",
      "# save times at or before t0 get y0; the others NaN until a step passes them",
      "jsv = 0", "for j in range(m):", "    if t_save[i, j] <= t:")
    _store_rows(w, 3, lambda q: f"sh_y[r{q}]", lambda q: w.ix("sh_s", f"r{q}"), "j")
    w(2, "    jsv = j + 1", "else:")
    _store_rows(w, 3, lambda q: "math.nan", lambda q: "math.nan", "j")
    w(1, w.bsync())


def _store_rows(w: Writer, d: int, yv, sv, j: str):
    """ys (and, for the sensitivity kernel, dys; ys from direction 0) at save index ``j``."""
    if not w.sens:
        w.rows(d, lambda q: [f"ys[i, {j}, r{q}] = {yv(q)}"])
        return
    w(d, "if d == 0:")
    w.rows(d + 1, lambda q: [f"ys[i, {j}, r{q}] = {yv(q)}"])
    w.rows(d, lambda q: [f"dys[d, i, {j}, r{q}] = {sv(q)}"])


def _eval_stage_monomials(w: Writer, d: int, t: str):
    """The monomials (and, sensitivity, their θ-derivatives) at time ``t`` into sh_gs."""
    w(d, f"tv = table_values({t}, p, args)")
    if w.sens:
        w(d, f"dtvt = table_values({t}, p, da)",
          f"mono_th_eval({t}, p, tv, dp, dtvt, sh_gs, Wp, NWU)")
    else:
        w(d, f"mono_eval({t}, p, tv, sh_gs)")


def _norm_parts(w: Writer, y_val, y_a, y_b, s_val=None, s_a=None, s_b=None):
    parts = [(y_val, y_a, y_b, "atol", "wt", True)]
    if w.sens:
        parts.append((s_val, s_a, s_b, "atol_s", "wt_s", False))
    return parts


def _initial_step(w: Writer):
    """HNW I §II.4, as the thread kernel (of the joint system for sens); the two evaluations of
    f share one site."""
    tab, sens, M = w.s.tableau, w.sens, w.s.n_mono
    w(1, "span = te - t", "hh = h0[i]", "if hh != hh:", "    hs = 0.0", "    d0 = 0.0",
      "    d1 = 0.0", "    d2 = 0.0", "    for ev in range(2):",
      "        tx = t if ev == 0 else t + hs", "        " + w.bsync())
    _eval_stage_monomials(w, 3, "tx")
    w(3, "acc = 0.0", "if ev == 0:")

    def first(q):
        lines = w.primal(w.entries(q, "sh_y", "fv", g="sh_gs") + [f"f0[{q}] = fv"])
        if sens:
            lines += _rhs_s(w, q, "sh_y", "sh_s", "sh_gs", M, "gv") + [f"g0[{q}] = gv"]
        return lines

    w.rows(4, first, guard=False)
    yv, sv = (lambda q: f"sh_y[r{q}]"), (lambda q: w.ix("sh_s", f"r{q}"))
    w.norm(4, _norm_parts(w, yv, yv, yv, sv, sv, sv), "d0")
    w.norm(4, _norm_parts(w, lambda q: f"f0[{q}]", yv, yv, lambda q: f"g0[{q}]", sv, sv), "d1")
    w(4, "if d0 < 1e-5 or d1 < 1e-5:", "    hs = 1e-6", "else:", "    hs = 0.01 * d0 / d1",
      "hs = _nmin(hs, span)")
    w.rows(4, lambda q: w.primal([f"sh_yi[r{q}] = sh_y[r{q}] + hs * f0[{q}]"])
           + ([f"{w.ix('sh_si', f'r{q}')} = {w.ix('sh_s', f'r{q}')} + hs * g0[{q}]"]
              if sens else []), guard=False)
    w(3, "else:")

    def second(q):
        lines = w.primal(w.entries(q, "sh_yi", "fv", g="sh_gs") + [
            f"sc = atol[r{q}] + rtol * _nmax(abs(sh_y[r{q}]), abs(sh_y[r{q}]))",
            f"rr = wt[r{q}] * (fv - f0[{q}]) / sc", "acc += rr * rr"])
        if sens:
            sq = w.ix("sh_s", f"r{q}")
            lines += _rhs_s(w, q, "sh_yi", "sh_si", "sh_gs", M, "gv") + [
                f"sc = atol_s[r{q}] + rtol * _nmax(abs({sq}), abs({sq}))",
                f"rr = wt_s[r{q}] * (gv - g0[{q}]) / sc", "acc += rr * rr"]
        return lines

    w.rows(4, second)
    w.reduce(4, "acc", "tot")
    w(4, "d2 = math.sqrt(tot / n_weighted) / hs")
    w(1, "    dmax = _nmax(d1, d2)", "    if dmax <= 1e-15:", "        h1 = _nmax(1e-6, hs * 1e-3)",
      "    else:", f"        h1 = (0.01 / dmax) ** {lit(1.0 / (tab.order + 1.0))}",
      "    hh = _nmin(100.0 * hs, h1)", "    if not (_isfin(hh) and hh > 0.0):",
      "        hh = 1e-6 * span", "    hh = _nmin(hh, span)", "else:", "    hh = _nmin(hh, span)")


def _step_start(w: Writer, nm: _Names):
    """Loop head; at a new point J (into sh_j, for W), f, ∂f/∂t and, sensitivity, s' and ∂s'/∂t
    -- from the monomials at t_n and their derivatives (sh_g)."""
    sens, M = w.sens, w.s.n_mono
    RUN, OK = int(Status.RUNNING), int(Status.OK)
    w(1, "h = hh", f"st = {RUN} if te > t else {OK}", "e1 = 1.0", "e2 = 1.0", "nacc = 0",
      "nrej = 0", "need_jac = True", f"while st == {RUN}:",
      "    to_end = te - t", "    last = h >= to_end", "    if last:", "        h = to_end",
      "    " + w.bsync(), "    if need_jac:",
      "        tv = table_values(t, p, args)", "        dtv = table_values_dt(t, p, args)")
    if sens:
        w(2, "    dtvt = table_values(t, p, da)", "    ddtvt = table_values_dt(t, p, da)",
          "    mono_all_eval(t, p, tv, dp, dtvt, dtv, ddtvt, sh_g, Wp, NWU)")
    else:
        w(2, "    mono_dt_eval(t, p, tv, dtv, sh_g)")

    def start(q):
        lines = w.primal(w.entries(q, "sh_y", "fv", store=True) + [f"f0[{q}] = fv"]
                         + w.entries(q, "sh_y", "fv", mono0=nm.dx) + [f"dt[{q}] = fv"])
        if sens:
            lines += (_rhs_s(w, q, "sh_y", "sh_s", "sh_g", M, "gv") + [f"g0[{q}] = gv"]
                      + _rhs_s(w, q, "sh_y", "sh_s", "sh_g", M, "gv", dx=(2 * M, 3 * M))
                      + [f"sdt[{q}] = gv"])
        return lines

    w.rows(3, start, guard=False)
    w(3, "need_jac = False")


def _stage_terms(w: Writer, st: int, q: int, kname: str, dname: str):
    tab, K = w.s.tableau, w.K
    terms = (["h * " + lit(tab.d[st]) + f" * {dname}[{q}]"] if tab.d[st] != 0.0 else [])
    terms += [f"({lit(tab.C[st, j])} / h) * {kname}[{j * K + q}]" for j in range(st)
              if tab.C[st, j] != 0.0]
    return "".join(f" + {x}" for x in terms)


def _stages(w: Writer, nm: _Names):
    s, K, sens, M = w.s, w.K, w.sens, w.s.n_mono
    tab, S = s.tableau, s.tableau.stages
    w(2, f"for sg in range({S}):", "    ev = False")
    for st in range(1, S):
        a = [(lit(tab.a[st, j]), j) for j in range(st) if tab.a[st, j] != 0.0]
        w(3, f"{'if' if st == 1 else 'elif'} sg == {st}:")

        def point(q, a=a):
            lines = w.primal([f"sh_yi[r{q}] = sh_y[r{q}]"
                              + "".join(f" + {c} * kk[{j * K + q}]" for c, j in a)])
            if sens:
                lines.append(f"{w.ix('sh_si', f'r{q}')} = {w.ix('sh_s', f'r{q}')}"
                             + "".join(f" + {c} * ks[{j * K + q}]" for c, j in a))
            return lines

        w.rows(4, point, guard=False)
        w(4, f"tj = t + {lit(tab.c[st])} * h", f"ev = {bool(tab.c[st] != tab.c[st - 1])}")
    w(3, "if sg > 0:", "    " + w.bsync(), "if ev:")
    _eval_stage_monomials(w, 4, "tj")
    # W from J(t_n), which every lane (of the primal warp) stored for its rows at the step's
    # start, factored by that warp alone
    w(3, "if sg == 0:")
    b = 4
    if sens:
        w(4, "if P0:")
        b = 5
    w(b, SYNC, f"inv = 1.0 / (h * {lit(tab.gamma)})")
    nrows = -(-s.nslots // s.lanes)
    for rr in range(nrows):
        base, ind = rr * s.lanes, b
        if base + s.lanes > s.nslots:
            w(b, f"if L < U64({s.nslots - base}):")
            ind = b + 1
        w(ind, f"code = {field(w.ws.wslot + base)}",
          "wv = -sh_j[(code >> U64(1)) - U64(1)] if code >= U64(2) else 0.0",
          "if (code & U64(1)) == U64(1):", "    wv += inv", f"sh_l[L + U64({base})] = wv")
    w(b, SYNC)
    w.factor(b)
    # the stage's rhs: f (and s') at the stage point (stage 0: at t_n) plus the tableau's terms
    if sens:
        w.rows(3, lambda q: [f"fv{q} = 0.0"], guard=False)
    w(3, "if sg == 0:")
    w.rows(4, lambda q: w.primal([f"fv{q} = f0[{q}]"]) + ([f"rs[{q}] = g0[{q}]"] if sens else []),
           guard=False)
    w(3, "else:")

    def stage_f(q):
        lines = w.primal(w.entries(q, "sh_yi", f"fv{q}", g="sh_gs"))
        if sens:
            lines += _rhs_s(w, q, "sh_yi", "sh_si", "sh_gs", M, "gv") + [f"rs[{q}] = gv"]
        return lines

    w.rows(4, stage_f, guard=False)
    for st in range(S):
        w(3, f"{'if' if st == 0 else 'elif'} sg == {st}:")
        w.rows(4, lambda q, st=st: w.primal([f"sh_x[p{q}] = fv{q}"
                                             + _stage_terms(w, st, q, "kk", "dt")])
               + ([f"rs[{q}] = rs[{q}]" + _stage_terms(w, st, q, "ks", "sdt")] if sens else []),
               guard=False)
    if sens:
        w(3, "if P0:")
        w(4, SYNC)
        w.solve(4, "sh_x")
        # k (sh_x) and the factorisation (sh_l) seen by every direction warp
        w(3, BSYNC)
        # W k_s = r_s + J_θ(t_n) k: k in sh_x, by elimination position
        w.rows(3, lambda q: w.entries(q, "sh_x", "gv", mono0=M, by_position=True)
               + [f"rs[{q}] = rs[{q}] + gv"], guard=False)
        w(3, SYNC)
        w.rows(3, lambda q: [f"{w.ix('sh_xs', f'p{q}')} = rs[{q}]"], guard=False)
        w(3, SYNC)
        w.solve(3, "sh_xs")
    else:
        w(3, SYNC)
        w.solve(3, "sh_x")
    for st in range(S):
        w(3, f"{'if' if st == 0 else 'elif'} sg == {st}:")
        w.rows(4, lambda q, st=st: w.primal([f"kk[{st * K + q}] = sh_x[p{q}]"])
               + ([f"ks[{st * K + q}] = {w.ix('sh_xs', f'p{q}')}"] if sens else []),
               guard=False)


def _error_control(w: Writer):
    s, K, sens = w.s, w.K, w.sens
    tab, ctrl, S = s.tableau, s.controller, s.tableau.stages
    k_ctrl = tab.embedded_order + 1.0
    b = [(lit(tab.b[j]), j) for j in range(S) if tab.b[j] != 0.0]
    er = [(lit(tab.e[j]), j) for j in range(S) if tab.e[j] != 0.0]
    w(2, "acc = 0.0")

    def one(q, kname, v, v1, atol, wts):
        comb = " + ".join(f"{c} * {kname}[{j * K + q}]" for c, j in er) if er else "0.0"
        return [f"yv = {w.ix(v, f'r{q}')}",
                f"{v1}[{q}] = yv" + "".join(f" + {c} * {kname}[{j * K + q}]" for c, j in b),
                f"ee = {comb}", f"sc = {atol}[r{q}] + rtol * _nmax(abs(yv), abs({v1}[{q}]))",
                f"rr = {wts}[r{q}] * ee / sc", "acc += rr * rr",
                f"if not _isfin({v1}[{q}]):", "    acc += math.inf"]

    w.rows(2, lambda q: w.primal(one(q, "kk", "sh_y", "y1", "atol", "wt"))
           + (one(q, "ks", "sh_s", "s1", "atol_s", "wt_s") if sens else []))
    w.reduce(2, "acc", "tot")
    fac = [lit(ctrl.safety)]
    for base, beta in (("err_s", ctrl.beta1), ("e1", ctrl.beta2), ("e2", ctrl.beta3)):
        if beta != 0.0:
            fac.append(f"{base} ** {lit(-beta / k_ctrl)}")
    w(2, "err = math.sqrt(tot / n_weighted)", "finite = _isfin(err)",
      "accept = finite and err <= 1.0", "err_s = _nmax(err if finite else 1.0, 1e-10)",
      "if accept:",
      f"    fac = _nmin(_nmax({' * '.join(fac)}, {lit(ctrl.factor_min)}), "
      f"{lit(ctrl.factor_max)})",
      "elif finite:",
      f"    fac = _nmin(_nmax({lit(ctrl.safety)} * err_s ** {lit(-1.0 / k_ctrl)}, "
      f"{lit(ctrl.factor_min)}), 1.0)",
      "else:", f"    fac = {lit(ctrl.factor_min)}", "h_new = h * fac",
      f"dt_min = {lit(ctrl.dt_min_rel)} * _nmax(abs(t), 1.0)")


def _accept(w: Writer, nm: _Names):
    s, K, sens = w.s, w.K, w.sens
    tab, S = s.tableau, s.tableau.stages
    H = tab.H
    if H.shape[0] != 3:
        raise ValueError("the dense-output formula needs exactly 3 H rows")
    OK, RUN = int(Status.OK), int(Status.RUNNING)
    w(2, "if accept:", "    while jsv < m and (t_save[i, jsv] <= t + h or last):",
      "        th = (t_save[i, jsv] - t) / h", "        om = 1.0 - th")

    def interp(kname, v, v1):
        def value(q):
            cs = []
            for r in range(3):
                terms = [f"{lit(H[r, j])} * {kname}[{j * K + q}]" for j in range(S)
                         if H[r, j] != 0.0]
                cs.append("(" + (" + ".join(terms) if terms else "0.0") + ")")
            return (f"om * {w.ix(v, f'r{q}')} + th * ({v1}[{q}] + om * ({cs[0]} + th * ({cs[1]} + th * "
                    f"{cs[2]})))")
        return value

    _store_rows(w, 4, interp("kk", "sh_y", "y1"), interp("ks", "sh_s", "s1"), "jsv")
    w(2, "        jsv += 1", "    if last:", "        t = te", "    else:", "        t = t + h")
    w.rows(3, lambda q: w.primal([f"sh_y[r{q}] = y1[{q}]"])
           + ([f"{w.ix('sh_s', f'r{q}')} = s1[{q}]"] if sens else []))
    w(2, "    nacc += 1", "    e2 = e1", "    e1 = err_s", "    need_jac = True",
      "    if last:", f"        st = {OK}", "else:", "    nrej += 1", "    if h_new < dt_min:",
      f"        st = {int(Status.STEP_TOO_SMALL)} if finite else {int(Status.NON_FINITE)}",
      "h = h_new", f"if st == {RUN} and nacc + nrej >= {int(s.max_steps)}:",
      f"    st = {int(Status.MAX_STEPS)}")
    w(1, "if L == U64(0):", f"    t_out[{nm.out}] = t", f"    status[{nm.out}] = st",
      f"    n_accepted[{nm.out}] = nacc", f"    n_rejected[{nm.out}] = nrej", "")


def _jac_kernel(w: Writer):
    """A test kernel: f, J (slot layout) and ∂f/∂t at given points through the warp code."""
    s, M, ws = w.s, w.s.n_mono, w.ws
    w(0, "def jac_kernel(y_in, t_in, params, args, f_out, jv_out, dfdt_out, n_traj, sched, "
         "sched_f):")
    w(1, "L = U64(cuda.threadIdx.x)", "i = cuda.blockIdx.x",
      f"sh_y = cuda.shared.array({s.n + 1}, F64)", f"sh_j = cuda.shared.array({s.m + 1}, F64)",
      f"sh_g = cuda.shared.array({2 * M}, F64)", "if i >= n_traj:", "    return")
    for q in range(w.K):
        w(1, f"r{q} = {field(ws.own_row[q])}")
    w(1, "if L == U64(0):", f"    sh_y[{s.n}] = 0.0", f"p = cuda.local.array({s.n_params}, F64)",
      f"for q in range({s.n_params}):", "    p[q] = params[i, q]")
    w.rows(1, lambda q: [f"sh_y[r{q}] = y_in[i, r{q}]"])
    w(1, SYNC, "t = t_in[i]", "tv = table_values(t, p, args)",
      "dtv = table_values_dt(t, p, args)", "mono_dt_eval(t, p, tv, dtv, sh_g)")
    w.rows(1, lambda q: w.entries(q, "sh_y", "fv", store=True) + [f"f_out[i, r{q}] = fv"]
           + w.entries(q, "sh_y", "gv", mono0=M) + [f"dfdt_out[i, r{q}] = gv"])
    w(1, SYNC)
    for rr in range(-(-s.nslots // s.lanes)):
        base = rr * s.lanes
        w(1, f"if L < U64({min(s.lanes, s.nslots - base)}):",
          f"    code = {field(ws.wslot + base)}",
          f"    jv_out[i, L + U64({base})] = sh_j[(code >> U64(1)) - U64(1)] "
          "if code >= U64(2) else 0.0")
    w(1, "")


def _kernel(spec: WarpSpec, sens: bool) -> list[str]:
    w = Writer(spec, sens)
    nm = _Names(w)
    _head(w)
    _initial_step(w)
    _step_start(w, nm)
    _stages(w, nm)
    _error_control(w)
    _accept(w, nm)
    return w.lines


_HELPERS = """def _nmax(a, b):
    # jnp.maximum: NaN if either is NaN
    if a != a or b != b:
        return a + b
    return a if a > b else b


def _nmin(a, b):
    if a != a or b != b:
        return a + b
    return a if a < b else b


def _isfin(v):
    return abs(v) <= 1.7976931348623157e308

"""


def generate_warp_source(spec: WarpSpec) -> str:
    """The module text: helpers, the monomial functions, ``kernel``, ``sens_kernel`` and
    ``jac_kernel``.  It expects the globals ``cuda``, ``F64``, ``U64``, ``table_values`` and
    ``table_values_dt`` (bound by the plan on a GPU, by the emulator on a CPU)."""
    if spec.n_tv < 1:
        raise ValueError("the warp kernel reads its tables through a TableSplit (n_tv >= 1)")
    jw = Writer(spec, False)
    _jac_kernel(jw)
    ws = spec.schedule
    head = (f'"""Generated warp kernels: n={spec.n}, P={spec.n_params}, entries={spec.m}, '
            f'monomials={spec.n_mono}, nslots={ws.nslots}, lanes={ws.lanes}, levels '
            f'{ws.n_factor_levels}/{ws.n_forward_levels}/{ws.n_backward_levels}, '
            f'tableau={spec.tableau.name}."""\n' "import math\n\nM = math\n\n\n")
    body = _kernel(spec, False) + _kernel(spec, True) + jw.lines
    return head + _HELPERS + "\n" + spec.mono_source + "\n\n" + "\n".join(body) + "\n"
