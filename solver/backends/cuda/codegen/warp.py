"""The warp kernel: one trajectory per warp of ``lanes`` threads, for linear right-hand sides.

Why: one trajectory per thread keeps a step's whole chain of dependent operations -- the RHS, the
Jacobian, the sparse LU and eight triangular solves on ~60 kB of local memory -- in one thread;
for the EB model that is ≈ 1.3 ms a step, whatever the GPU's width.  A linear rhs f = J(t) y
(``rhs.linear_jacobian``) lets the lanes split all of it:

* J's entries are sums of constant multiples of M monomials of a few dozen atoms
  (``solver.linalg.entry_terms``): every lane computes the monomials (``warp_entries``), then
  its own rows' entries and their share of f = J y;
* W = I/(hγ) − J is factored level by level, U scaled to unit upper, and every stage's two
  triangular solves run as column-oriented update levels (``warp_schedule``), all in shared
  memory, on an elimination order chosen for few levels (``ordering="depth"``), a
  ``syncwarp`` between levels;
* stage vectors, f and ∂f/∂t live in each lane's local memory for its owned rows; the error
  norm is a reduction through shared memory (shuffles are avoided: numba-cuda-mlir 0.5.4 rounds
  a float64 shuffle through float32).

The text is straight-line per phase: what a lane does comes from the schedule's fields, read at
literal offsets with unsigned indices (no loop bookkeeping, no negative-index wrapping).  The
algorithm -- initial step, Rodas stages (rolled: the tableau's literals in one branch a stage),
PID controller, dense output, statuses -- is the thread kernel's (``codegen.rodas``), so its
results equal the JAX backend's to rounding; J is re-evaluated at a stage only where the stage
time changes (Rodas5P's last three stages share t + h).  ``cuda.syncwarp()`` appears only as a
statement of its own, so the CPU emulator can turn it into ``yield`` (``cuda.emulation``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ....problem.status import Status
from .spec import KERNEL_ARGS, lit

__all__ = ["WarpSpec", "WARP_KERNEL_ARGS", "generate_warp_source", "SYNC"]

#: the warp kernel's positional arguments: the thread kernel's, then the schedule's tables
WARP_KERNEL_ARGS = KERNEL_ARGS + ("sched", "sched_f")
#: the synchronisation statement (the emulator replaces exactly this line)
SYNC = "cuda.syncwarp()"


@dataclass(frozen=True)
class WarpSpec:
    """What the warp kernel's text depends on (tolerances and arrays are arguments)."""

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

    @property
    def lanes(self) -> int:
        return self.schedule.lanes

    @property
    def nslots(self) -> int:
        return self.schedule.nslots

    @property
    def shared_bytes(self) -> int:
        """Static shared memory of one block (one warp)."""
        n = self.n + 1
        return 8 * (self.nslots + 2 + 3 * n + self.lanes + self.m + 1 + 2 * self.n_mono)


class _E:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, d: int, *texts: str):
        for t in texts:
            self.lines.append("    " * d + t)


def _f(off: int) -> str:
    """The lane's value of the int field at ``off``."""
    return f"U64(sched[L + U64({off})])"


def _g(off: int) -> str:
    return f"sched_f[L + U64({off})]"


class _Writer:
    def __init__(self, spec: WarpSpec):
        self.s, self.ws, self.e = spec, spec.schedule, _E()
        self.K = spec.schedule.per_lane
        self.n = spec.n

    # -- owned rows ------------------------------------------------------------------------
    def rows(self, d: int, body, guard: bool = True):
        """``body(q)`` lines for each owned row q (variables r{q}, p{q}); ``guard``: only real
        rows (r < n)."""
        for q in range(self.K):
            lines = body(q)
            if not lines:
                continue
            if guard:
                self.e(d, f"if r{q} < U64({self.n}):")
                self.e(d + 1, *lines)
            else:
                self.e(d, *lines)

    def entries(self, q: int, vec: str, out: str, mono0: int = 0, store: bool = False):
        """Lines: ``out`` = row q of J (monomials at ``sh_g[mono0 + m]``) times ``vec``; with
        ``store`` each entry also goes to ``sh_j`` (for W)."""
        L = [f"{out} = 0.0"]
        for ent in self.ws.entries[q]:
            terms = [f"{_g(c)} * sh_g[U64({mono0}) + {_f(mo)}]" for c, mo in zip(ent.coefs,
                                                                                 ent.monos)]
            L.append(f"jv = {' + '.join(terms) if terms else '0.0'}")
            if store:
                L.append(f"sh_j[{_f(ent.index)}] = jv")
            L.append(f"{out} += jv * {vec}[{_f(ent.col)}]")
        return L

    def reduce(self, d: int, acc: str, out: str):
        W = self.s.lanes
        self.e(d, f"sh_r[L] = {acc}", SYNC, "tot = 0.0")
        self.e(d, *[f"tot += sh_r[{ln}]" for ln in range(W)])
        self.e(d, SYNC, f"{out} = tot")

    def norm(self, d: int, value, ya, yb, out: str):
        """``out`` = weighted RMS of value(q) with scales from ya(q), yb(q)."""
        self.e(d, "acc = 0.0")
        self.rows(d, lambda q: [f"sc = atol[r{q}] + rtol * _nmax(abs({ya(q)}), abs({yb(q)}))",
                                f"rr = weights[r{q}] * ({value(q)}) / sc", "acc += rr * rr"])
        self.reduce(d, "acc", "tot")
        self.e(d, f"{out} = math.sqrt(tot / n_weighted)")

    # -- linear algebra --------------------------------------------------------------------
    def factor(self, d: int):
        for lv, level in enumerate(self.ws.factor):
            self.e(d, f"# factor level {lv}")
            for rd in level:
                self.e(d, f"hd = {_f(rd.head)}", "dst = hd & M16", "acc = sh_l[dst]")
                for pr in rd.pairs:
                    self.e(d, f"pr = {_f(pr)}", "acc -= sh_l[pr & M16] * sh_l[pr >> S16]")
                if 1 in rd.ops:
                    self.e(d, "if (hd >> S16) == U64(1):",
                           f"    acc = acc * sh_l[{_f(rd.aux)}]")
                if 2 in rd.ops:
                    self.e(d, "if (hd >> S16) == U64(2):", "    acc = 1.0 / acc")
                self.e(d, "sh_l[dst] = acc")
            self.e(d, SYNC)
        for at in self.ws.uscale:
            self.e(d, f"pr = {_f(at)}", "sh_l[pr & M16] = sh_l[pr & M16] * sh_l[pr >> S16]")
        self.e(d, SYNC)

    def solve(self, d: int):
        """sh_x (elimination order) overwritten by W⁻¹ sh_x."""
        def levels(lv_list, what):
            for lv, level in enumerate(lv_list):
                self.e(d, f"# {what} level {lv}")
                for rd in level:
                    self.e(d, f"kr = {_f(rd.head)}", "acc = sh_x[kr]")
                    for pr in rd.pairs:
                        self.e(d, f"pr = {_f(pr)}", "acc -= sh_l[pr & M16] * sh_x[pr >> S16]")
                    self.e(d, "sh_x[kr] = acc")
                self.e(d, SYNC)

        levels(self.ws.forward, "forward")
        self.rows(d, lambda q: [f"sh_x[p{q}] = sh_x[p{q}] * sh_l[dg{q}]"], guard=False)
        self.e(d, SYNC)
        levels(self.ws.backward, "backward")


def _head(w: _Writer):
    s, e, K, n = w.s, w.e, w.K, w.n
    S = s.tableau.stages
    n1 = n + 1
    e(0, "def kernel(" + ", ".join(WARP_KERNEL_ARGS) + "):")
    e(1, "L = U64(cuda.threadIdx.x)",
      "i = cuda.blockIdx.x",
      f"sh_l = cuda.shared.array({s.nslots + 2}, F64)",
      f"sh_y = cuda.shared.array({n1}, F64)",
      f"sh_yi = cuda.shared.array({n1}, F64)",
      f"sh_x = cuda.shared.array({n1}, F64)",
      f"sh_r = cuda.shared.array({s.lanes}, F64)",
      f"sh_j = cuda.shared.array({s.m + 1}, F64)",
      f"sh_g = cuda.shared.array({2 * s.n_mono}, F64)",
      "if i >= n_traj:",
      "    return",
      "M16 = U64(65535)",
      "S16 = U64(16)")
    for q in range(K):
        e(1, f"r{q} = {_f(w.ws.own_row[q])}", f"p{q} = {_f(w.ws.own_pos[q])}",
          f"dg{q} = {_f(w.ws.own_diag[q])}")
    e(1, "if L == U64(0):",
      f"    sh_l[{w.ws.scratch}] = 0.0",
      f"    sh_l[{w.ws.zero}] = 0.0",
      f"    sh_y[{n}] = 0.0",
      f"    sh_yi[{n}] = 0.0",
      f"    sh_x[{n}] = 0.0",
      f"    sh_j[{s.m}] = 0.0",
      f"p = cuda.local.array({s.n_params}, F64)",
      f"kk = cuda.local.array({S * K}, F64)",
      f"f0 = cuda.local.array({K}, F64)",
      f"dt = cuda.local.array({K}, F64)",
      f"y1 = cuda.local.array({K}, F64)",
      f"for q in range({s.n_params}):",
      "    p[q] = params[i, q]")
    w.rows(1, lambda q: [f"sh_y[r{q}] = y0[i, r{q}]"])
    e(1, "t = t0[i]", "te = t_end[i]", "m = t_save.shape[1]",
      "# save times at or before t0 get y0; the others NaN until a step passes them",
      "jsv = 0", "for j in range(m):", "    if t_save[i, j] <= t:")
    w.rows(3, lambda q: [f"ys[i, j, r{q}] = sh_y[r{q}]"])
    e(2, "    jsv = j + 1", "else:")
    w.rows(3, lambda q: [f"ys[i, j, r{q}] = math.nan"])
    e(1, SYNC)


def _initial_step(w: _Writer):
    """HNW I §II.4, as the thread kernel; the two evaluations of f share one J site."""
    e, tab = w.e, w.s.tableau
    e(1, "span = te - t", "hh = h0[i]", "if hh != hh:", "    hs = 0.0", "    d0 = 0.0",
      "    d1 = 0.0", "    d2 = 0.0", "    for ev in range(2):",
      "        tx = t if ev == 0 else t + hs",
      "        " + SYNC,
      "        tv = table_values(tx, p, args)",
      "        mono_eval(tx, p, tv, sh_g)",
      "        acc = 0.0")
    e(3, "if ev == 0:")
    w.rows(4, lambda q: w.entries(q, "sh_y", "fv") + [f"f0[{q}] = fv"], guard=False)
    _norm_y = (lambda q: f"sh_y[r{q}]")
    w.norm(4, _norm_y, _norm_y, _norm_y, "d0")
    w.norm(4, lambda q: f"f0[{q}]", _norm_y, _norm_y, "d1")
    e(4, "if d0 < 1e-5 or d1 < 1e-5:", "    hs = 1e-6", "else:", "    hs = 0.01 * d0 / d1",
      "hs = _nmin(hs, span)")
    w.rows(4, lambda q: [f"sh_yi[r{q}] = sh_y[r{q}] + hs * f0[{q}]"], guard=False)
    e(3, "else:")
    w.rows(4, lambda q: w.entries(q, "sh_yi", "fv") + [
        f"sc = atol[r{q}] + rtol * _nmax(abs(sh_y[r{q}]), abs(sh_y[r{q}]))",
        f"rr = weights[r{q}] * (fv - f0[{q}]) / sc", "acc += rr * rr"])
    w.reduce(4, "acc", "tot")
    e(4, "d2 = math.sqrt(tot / n_weighted) / hs")
    e(1, "    dmax = _nmax(d1, d2)", "    if dmax <= 1e-15:", "        h1 = _nmax(1e-6, hs * 1e-3)",
      "    else:", f"        h1 = (0.01 / dmax) ** {lit(1.0 / (tab.order + 1.0))}",
      "    hh = _nmin(100.0 * hs, h1)", "    if not (_isfin(hh) and hh > 0.0):",
      "        hh = 1e-6 * span", "    hh = _nmin(hh, span)", "else:", "    hh = _nmin(hh, span)")


def _step_start(w: _Writer):
    """Loop head; at a new point J, f and ∂f/∂t (the monomials and their derivatives)."""
    e, M = w.e, w.s.n_mono
    RUN, OK = int(Status.RUNNING), int(Status.OK)
    e(1, "h = hh", f"st = {RUN} if te > t else {OK}", "e1 = 1.0", "e2 = 1.0", "nacc = 0",
      "nrej = 0", "need_jac = True", f"while st == {RUN}:",
      "    to_end = te - t", "    last = h >= to_end", "    if last:", "        h = to_end",
      "    " + SYNC, "    fresh = need_jac", "    if need_jac:",
      "        tv = table_values(t, p, args)",
      "        dtv = table_values_dt(t, p, args)",
      "        mono_dt_eval(t, p, tv, dtv, sh_g)")
    w.rows(3, lambda q: w.entries(q, "sh_y", "fv", store=True) + [f"f0[{q}] = fv"]
           + w.entries(q, "sh_y", "gv", mono0=M) + [f"dt[{q}] = gv"], guard=False)
    e(3, "need_jac = False")


def _stages(w: _Writer):
    s, e, K = w.s, w.e, w.K
    tab, S = s.tableau, s.tableau.stages
    ws = w.ws
    e(2, f"for sg in range({S}):", "    if sg == 0:", "        tj = t",
      "        ev = not fresh")
    for st in range(1, S):
        a = [(lit(tab.a[st, j]), j) for j in range(st) if tab.a[st, j] != 0.0]
        e(3, f"elif sg == {st}:")
        w.rows(4, lambda q, a=a: [f"sh_yi[r{q}] = sh_y[r{q}]"
                                  + "".join(f" + {c} * kk[{j * K + q}]" for c, j in a)],
               guard=False)
        e(4, f"tj = t + {lit(tab.c[st])} * h", f"ev = {bool(tab.c[st] != tab.c[st - 1])}")
    e(3, "if sg > 0:", "    " + SYNC, "if ev:",
      "    tv = table_values(tj, p, args)",
      "    mono_eval(tj, p, tv, sh_g)")
    e(3, "if sg == 0:")
    e(4, "if ev:")
    w.rows(5, lambda q: w.entries(q, "sh_y", "fv", store=True), guard=False)
    e(4, SYNC, f"inv = 1.0 / (h * {lit(tab.gamma)})")
    nrows = -(-s.nslots // s.lanes)
    for rr in range(nrows):
        base = rr * s.lanes
        ind = 4
        if base + s.lanes > s.nslots:
            e(4, f"if L < U64({s.nslots - base}):")
            ind = 5
        e(ind, f"code = {_f(ws.wslot + base)}",
          "wv = -sh_j[(code >> U64(1)) - U64(1)] if code >= U64(2) else 0.0",
          "if (code & U64(1)) == U64(1):", "    wv += inv",
          f"sh_l[L + U64({base})] = wv")
    e(4, SYNC)
    w.factor(4)
    # the stage's rhs: f at the stage point (stage 0: f0) plus the tableau's terms
    e(3, "if sg == 0:")
    w.rows(4, lambda q: [f"fv{q} = f0[{q}]"], guard=False)
    e(3, "else:")
    w.rows(4, lambda q: w.entries(q, "sh_yi", f"fv{q}"), guard=False)
    for st in range(S):
        e(3, f"{'if' if st == 0 else 'elif'} sg == {st}:")

        def rhs(q, st=st):
            terms = (["h * " + lit(tab.d[st]) + f" * dt[{q}]"] if tab.d[st] != 0.0 else [])
            terms += [f"({lit(tab.C[st, j])} / h) * kk[{j * K + q}]" for j in range(st)
                      if tab.C[st, j] != 0.0]
            return [f"sh_x[p{q}] = fv{q}" + "".join(f" + {x}" for x in terms)]

        w.rows(4, rhs, guard=False)
    e(3, SYNC)
    w.solve(3)
    for st in range(S):
        e(3, f"{'if' if st == 0 else 'elif'} sg == {st}:")
        w.rows(4, lambda q, st=st: [f"kk[{st * K + q}] = sh_x[p{q}]"], guard=False)


def _error_control(w: _Writer):
    s, e, K = w.s, w.e, w.K
    tab, ctrl, S = s.tableau, s.controller, s.tableau.stages
    k_ctrl = tab.embedded_order + 1.0
    b = [(lit(tab.b[j]), j) for j in range(S) if tab.b[j] != 0.0]
    er = [(lit(tab.e[j]), j) for j in range(S) if tab.e[j] != 0.0]
    e(2, "acc = 0.0")

    def one(q):
        comb = " + ".join(f"{c} * kk[{j * K + q}]" for c, j in er) if er else "0.0"
        return [f"yv = sh_y[r{q}]",
                f"y1[{q}] = yv" + "".join(f" + {c} * kk[{j * K + q}]" for c, j in b),
                f"ee = {comb}",
                f"sc = atol[r{q}] + rtol * _nmax(abs(yv), abs(y1[{q}]))",
                f"rr = weights[r{q}] * ee / sc", "acc += rr * rr",
                f"if not _isfin(y1[{q}]):", "    acc += math.inf"]

    w.rows(2, one)
    w.reduce(2, "acc", "tot")
    fac = [lit(ctrl.safety)]
    for base, beta in (("err_s", ctrl.beta1), ("e1", ctrl.beta2), ("e2", ctrl.beta3)):
        if beta != 0.0:
            fac.append(f"{base} ** {lit(-beta / k_ctrl)}")
    e(2, "err = math.sqrt(tot / n_weighted)", "finite = _isfin(err)",
      "accept = finite and err <= 1.0", "err_s = _nmax(err if finite else 1.0, 1e-10)",
      "if accept:",
      f"    fac = _nmin(_nmax({' * '.join(fac)}, {lit(ctrl.factor_min)}), "
      f"{lit(ctrl.factor_max)})",
      "elif finite:",
      f"    fac = _nmin(_nmax({lit(ctrl.safety)} * err_s ** {lit(-1.0 / k_ctrl)}, "
      f"{lit(ctrl.factor_min)}), 1.0)",
      "else:", f"    fac = {lit(ctrl.factor_min)}", "h_new = h * fac",
      f"dt_min = {lit(ctrl.dt_min_rel)} * _nmax(abs(t), 1.0)")


def _accept(w: _Writer):
    s, e, K = w.s, w.e, w.K
    tab, S = s.tableau, s.tableau.stages
    H = tab.H
    if H.shape[0] != 3:
        raise ValueError("the dense-output formula needs exactly 3 H rows")
    OK, RUN = int(Status.OK), int(Status.RUNNING)
    e(2, "if accept:", "    while jsv < m and (t_save[i, jsv] <= t + h or last):",
      "        th = (t_save[i, jsv] - t) / h", "        om = 1.0 - th")

    def dense(q):
        out = []
        for r in range(3):
            terms = [f"{lit(H[r, j])} * kk[{j * K + q}]" for j in range(S) if H[r, j] != 0.0]
            out.append(f"c{r} = " + (" + ".join(terms) if terms else "0.0"))
        return out + [f"ys[i, jsv, r{q}] = om * sh_y[r{q}] + th * (y1[{q}] + om * "
                      "(c0 + th * (c1 + th * c2)))"]

    w.rows(4, dense)
    e(2, "        jsv += 1", "    if last:", "        t = te", "    else:", "        t = t + h")
    w.rows(3, lambda q: [f"sh_y[r{q}] = y1[{q}]"])
    e(2, "    nacc += 1", "    e2 = e1", "    e1 = err_s", "    need_jac = True",
      "    if last:", f"        st = {OK}", "else:", "    nrej += 1", "    if h_new < dt_min:",
      f"        st = {int(Status.STEP_TOO_SMALL)} if finite else {int(Status.NON_FINITE)}",
      "h = h_new", f"if st == {RUN} and nacc + nrej >= {int(s.max_steps)}:",
      f"    st = {int(Status.MAX_STEPS)}")
    e(1, "if L == U64(0):", "    t_out[i] = t", "    status[i] = st", "    n_accepted[i] = nacc",
      "    n_rejected[i] = nrej", "")


def _jac_kernel(w: _Writer):
    """A test kernel: f, J (slot layout) and ∂f/∂t at given points through the warp code."""
    s, e, M = w.s, w.e, w.s.n_mono
    ws = w.ws
    e(0, "def jac_kernel(y_in, t_in, params, args, f_out, jv_out, dfdt_out, n_traj, sched, "
         "sched_f):")
    e(1, "L = U64(cuda.threadIdx.x)", "i = cuda.blockIdx.x",
      f"sh_y = cuda.shared.array({s.n + 1}, F64)",
      f"sh_j = cuda.shared.array({s.m + 1}, F64)",
      f"sh_g = cuda.shared.array({2 * M}, F64)",
      "if i >= n_traj:", "    return")
    for q in range(w.K):
        e(1, f"r{q} = {_f(ws.own_row[q])}")
    e(1, "if L == U64(0):", f"    sh_y[{s.n}] = 0.0",
      f"p = cuda.local.array({s.n_params}, F64)",
      f"for q in range({s.n_params}):", "    p[q] = params[i, q]")
    w.rows(1, lambda q: [f"sh_y[r{q}] = y_in[i, r{q}]"])
    e(1, SYNC, "t = t_in[i]", "tv = table_values(t, p, args)",
      "dtv = table_values_dt(t, p, args)", "mono_dt_eval(t, p, tv, dtv, sh_g)")
    w.rows(1, lambda q: w.entries(q, "sh_y", "fv", store=True) + [f"f_out[i, r{q}] = fv"]
           + w.entries(q, "sh_y", "gv", mono0=M) + [f"dfdt_out[i, r{q}] = gv"])
    e(1, SYNC)
    for rr in range(-(-s.nslots // s.lanes)):
        base = rr * s.lanes
        e(1, f"if L < U64({min(s.lanes, s.nslots - base)}):",
          f"    code = {_f(ws.wslot + base)}",
          f"    jv_out[i, L + U64({base})] = sh_j[(code >> U64(1)) - U64(1)] "
          "if code >= U64(2) else 0.0")
    e(1, "")


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
    """The module text: helpers, ``mono_eval`` / ``mono_dt_eval``, ``kernel`` and
    ``jac_kernel``.  It expects the globals ``cuda``, ``F64``, ``U64``, ``table_values`` and
    ``table_values_dt`` (bound by the plan on a GPU, by the emulator on a CPU)."""
    if spec.n_tv < 1:
        raise ValueError("the warp kernel reads its tables through a TableSplit (n_tv >= 1)")
    w = _Writer(spec)
    _head(w)
    _initial_step(w)
    _step_start(w)
    _stages(w)
    _error_control(w)
    _accept(w)
    _jac_kernel(w)
    ws = spec.schedule
    head = (f'"""Generated warp kernel: n={spec.n}, P={spec.n_params}, entries={spec.m}, '
            f'monomials={spec.n_mono}, nslots={ws.nslots}, lanes={ws.lanes}, levels '
            f'{ws.n_factor_levels}/{ws.n_forward_levels}/{ws.n_backward_levels}, '
            f'tableau={spec.tableau.name}."""\n' "import math\n\nM = math\n\n\n")
    return head + _HELPERS + "\n" + spec.mono_source + "\n\n" + "\n".join(w.e.lines) + "\n"
