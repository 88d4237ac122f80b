"""The warp kernel: one trajectory per warp of ``lanes`` threads, for linear right-hand sides.

Why: one trajectory per thread keeps a step's whole chain of dependent operations -- the RHS,
22 colour sweeps or the declared Jacobian, the sparse LU and eight triangular solves on ~60 kB of
local memory -- in one thread; for the EB model that is ≈ 1.3 ms a step, whatever the GPU's
width.  A linear rhs f = J(t) y (``rhs.linear_jacobian``) lets the lanes split all of it:

* J(t) is evaluated by every lane from the generated entries (``warp_entries``: registers,
  no divergence) into shared memory; f = J y is a sparse product, each lane its owned rows;
* W = I/(hγ) − J, its factorisation and the solves run level by level from the tables of
  ``warp_schedule`` (a ``syncwarp`` between levels), in shared memory, on an elimination order
  chosen for few levels (``solver.linalg.ordering.depth_order``);
* stage vectors, f and ∂f/∂t live in each lane's local memory for its owned states; the error
  norm is a reduction through shared memory (shuffles are avoided: numba-cuda-mlir 0.5.4 rounds
  a float64 shuffle through float32).

The algorithm -- initial step, Rodas stages (rolled: the tableau's literals in one branch a
stage, one J evaluation site), PID controller, dense output, statuses -- is the thread kernel's
(``codegen.rodas``), so its results equal the JAX backend's to rounding.  J is re-evaluated at a
stage only where the stage time changes (Rodas5P's last three stages share t + h).

Shared memory per warp: J's m entries, the LU's slots and 3n + lanes doubles (y, the stage point,
the solve vector, the reduction); ``WarpSpec.shared_bytes``.  ``cuda.syncwarp()`` appears only
as a statement of its own, so the CPU emulator can turn it into ``yield`` (``cuda.emulation``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ....problem.status import Status
from .spec import KERNEL_ARGS, lit

__all__ = ["WarpSpec", "WARP_KERNEL_ARGS", "generate_warp_source", "SYNC"]

#: the warp kernel's positional arguments: the thread kernel's, then the schedule table
WARP_KERNEL_ARGS = KERNEL_ARGS + ("sched",)
#: the synchronisation statement (the emulator replaces exactly this line)
SYNC = "cuda.syncwarp()"


@dataclass(frozen=True)
class WarpSpec:
    """What the warp kernel's text depends on (tolerances and arrays are arguments)."""

    n: int
    n_params: int
    n_tv: int
    m: int                    # declared Jacobian entries
    max_steps: int
    tableau: object
    controller: object
    schedule: object          # warp_schedule.WarpSchedule
    entries_source: str       # warp_entries.entry_functions
    warps_per_block: int = 1

    @property
    def lanes(self) -> int:
        return self.schedule.lanes

    @property
    def nslots(self) -> int:
        return self.schedule.nslots

    @property
    def vector_size(self) -> int:
        return 3 * self.n + self.lanes

    @property
    def shared_bytes(self) -> int:
        """Static shared memory of one block."""
        return 8 * self.warps_per_block * (self.m + self.nslots + self.vector_size)


class _E:
    """Indented lines."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, depth: int, *texts: str):
        for t in texts:
            self.lines.append("    " * depth + t)


def _owned(e: _E, d: int, K: int):
    """Open the loop over a lane's owned states: ``q`` (local index), ``r`` (state); the body
    goes at depth d + 2."""
    e(d, f"for q in range({K}):",
      "    r = sched[own0 + q]",
      "    if r >= 0:")


def _reduce(e: _E, d: int, W: int, acc: str, out: str):
    """``out`` = sum over the lanes of each lane's ``acc`` (every lane gets the same sum)."""
    e(d, f"sh_v[rb + lane] = {acc}", SYNC, "tot = 0.0", f"for ln in range({W}):",
      "    tot += sh_v[rb + ln]", SYNC, f"{out} = tot")


def _norm(e: _E, d: int, spec: WarpSpec, value: str, ya: str, yb: str, out: str):
    """``out`` = the weighted RMS norm of the owned ``value`` with scales from ``ya``, ``yb``
    (expressions in q and r), as the thread kernel's ``wrms``."""
    e(d, "acc = 0.0")
    _owned(e, d, spec.schedule.per_lane)
    e(d + 2, f"sc = atol[r] + rtol * _nmax(abs({ya}), abs({yb}))",
      f"rr = weights[r] * ({value}) / sc", "acc += rr * rr")
    _reduce(e, d, spec.lanes, "acc", "tot")
    e(d, f"{out} = math.sqrt(tot / n_weighted)")


def _matvec(e: _E, d: int, vec: str, out: str, entries: str = "sh_j", base: str = "jb"):
    """``out`` = row r of J times the shared vector at offset ``vec`` (inside an owned loop)."""
    o = "{JROW}"
    e(d, f"{out} = 0.0",
      f"for ee in range(sched[{o} + r], sched[{o} + r + 1]):",
      f"    {out} += {entries}[{base} + ee] * sh_v[{vec} + sched[{{JCOL}} + ee]]")


def _levels(e: _E, d: int, spec: WarpSpec, kind: str):
    """The factorisation (``factor``) or a triangular solve (``solve``) level by level."""
    W, ws = spec.lanes, spec.schedule
    if kind == "factor":
        e(d, f"for lv in range({ws.n_factor_levels}):",
          "    ta = sched[{FLEV} + lv]",
          "    tb = sched[{FLEV} + lv + 1]",
          f"    for tk in range(ta + lane, tb, {W}):",
          "        at = {FDATA} + sched[{FTASK} + tk]",
          "        dst = lb + sched[at]",
          "        cnt = sched[at + 1]",
          "        if cnt >= 0:",
          "            acc = sh_l[dst]",
          "            for qq in range(cnt):",
          "                acc -= sh_l[lb + sched[at + 2 + 2 * qq]] * "
          "sh_l[lb + sched[at + 3 + 2 * qq]]",
          "            sh_l[dst] = acc",
          "        elif cnt == -1:",
          "            sh_l[dst] = sh_l[dst] * sh_l[lb + sched[at + 2]]",
          "        else:",
          "            sh_l[dst] = 1.0 / sh_l[dst]",
          "    " + SYNC)
        return
    e(d, f"for lv in range({ws.n_forward_levels}):",
      "    ta = sched[{VLEV} + lv]",
      "    tb = sched[{VLEV} + lv + 1]",
      f"    for tk in range(ta + lane, tb, {W}):",
      "        at = {VDATA} + sched[{VTASK} + tk]",
      "        kr = sched[at]",
      "        acc = sh_v[xb + kr]",
      "        for qq in range(sched[at + 1]):",
      "            acc -= sh_l[lb + sched[at + 2 + 2 * qq]] * sh_v[xb + sched[at + 3 + 2 * qq]]",
      "        sh_v[xb + kr] = acc",
      "    " + SYNC)
    e(d, f"for lv in range({ws.n_backward_levels}):",
      "    ta = sched[{BLEV} + lv]",
      "    tb = sched[{BLEV} + lv + 1]",
      f"    for tk in range(ta + lane, tb, {W}):",
      "        at = {BDATA} + sched[{BTASK} + tk]",
      "        kr = sched[at]",
      "        acc = sh_v[xb + kr]",
      "        for qq in range(sched[at + 2]):",
      "            acc -= sh_l[lb + sched[at + 3 + 2 * qq]] * sh_v[xb + sched[at + 4 + 2 * qq]]",
      "        sh_v[xb + kr] = acc * sh_l[lb + sched[at + 1]]",
      "    " + SYNC)


def _head(e: _E, spec: WarpSpec):
    n, P, W, WPB = spec.n, spec.n_params, spec.lanes, spec.warps_per_block
    K, S = spec.schedule.per_lane, spec.tableau.stages
    e(0, "def kernel(" + ", ".join(WARP_KERNEL_ARGS) + "):")
    e(1, "tid = cuda.threadIdx.x",
      f"lane = tid % {W}",
      f"wb = tid // {W}",
      f"i = cuda.blockIdx.x * {WPB} + wb",
      f"sh_j = cuda.shared.array({WPB * spec.m}, F64)",
      f"sh_l = cuda.shared.array({WPB * spec.nslots}, F64)",
      f"sh_v = cuda.shared.array({WPB * spec.vector_size}, F64)",
      "if i >= n_traj:",
      "    return",
      f"jb = wb * {spec.m}",
      f"lb = wb * {spec.nslots}",
      f"yb = wb * {spec.vector_size}",
      f"yib = yb + {n}",
      f"xb = yb + {2 * n}",
      f"rb = yb + {3 * n}",
      f"own0 = {{OWN}} + lane * {K}",
      f"p = cuda.local.array({P}, F64)",
      f"kk = cuda.local.array({S * K}, F64)",
      f"f0 = cuda.local.array({K}, F64)",
      f"dt = cuda.local.array({K}, F64)",
      f"y1 = cuda.local.array({K}, F64)",
      f"for q in range({P}):",
      "    p[q] = params[i, q]")
    _owned(e, 1, K)
    e(3, "sh_v[yb + r] = y0[i, r]")
    e(1, "t = t0[i]", "te = t_end[i]", "m = t_save.shape[1]",
      "# save times at or before t0 get y0; the others NaN until a step passes them",
      "jsv = 0", "for j in range(m):", "    if t_save[i, j] <= t:")
    _owned(e, 3, K)
    e(5, "ys[i, j, r] = sh_v[yb + r]")
    e(2, "    jsv = j + 1", "else:")
    _owned(e, 3, K)
    e(5, "ys[i, j, r] = math.nan")
    e(1, SYNC)


def _initial_step(e: _E, spec: WarpSpec):
    """HNW I §II.4, as the thread kernel; the two evaluations of f share one J site."""
    K, tab = spec.schedule.per_lane, spec.tableau
    e(1, "span = te - t", "hh = h0[i]", "if hh != hh:", "    hs = 0.0", "    d0 = 0.0",
      "    d1 = 0.0", "    d2 = 0.0", "    for ev in range(2):",
      "        tx = t if ev == 0 else t + hs",
      "        " + SYNC,
      "        tv = table_values(tx, p, args)",
      "        jac_entries(tx, p, tv, sh_j, jb)",
      "        acc = 0.0")
    _owned(e, 3, K)
    e(5, "src = yb if ev == 0 else yib")
    _matvec(e, 5, "src", "fv")
    e(5, "if ev == 0:", "    f0[q] = fv", "else:",
      "    yv = sh_v[yb + r]",
      "    sc = atol[r] + rtol * _nmax(abs(yv), abs(yv))",
      "    rr = weights[r] * (fv - f0[q]) / sc",
      "    acc += rr * rr")
    e(3, "if ev == 0:")
    _norm(e, 4, spec, "sh_v[yb + r]", "sh_v[yb + r]", "sh_v[yb + r]", "d0")
    _norm(e, 4, spec, "f0[q]", "sh_v[yb + r]", "sh_v[yb + r]", "d1")
    e(4, "if d0 < 1e-5 or d1 < 1e-5:", "    hs = 1e-6", "else:", "    hs = 0.01 * d0 / d1",
      "hs = _nmin(hs, span)")
    _owned(e, 4, K)
    e(6, "sh_v[yib + r] = sh_v[yb + r] + hs * f0[q]")
    e(3, "else:")
    _reduce(e, 4, spec.lanes, "acc", "tot")
    e(4, "d2 = math.sqrt(tot / n_weighted) / hs")
    e(1, "    dmax = _nmax(d1, d2)", "    if dmax <= 1e-15:", "        h1 = _nmax(1e-6, hs * 1e-3)",
      "    else:", f"        h1 = (0.01 / dmax) ** {lit(1.0 / (tab.order + 1.0))}",
      "    hh = _nmin(100.0 * hs, h1)", "    if not (_isfin(hh) and hh > 0.0):",
      "        hh = 1e-6 * span", "    hh = _nmin(hh, span)", "else:", "    hh = _nmin(hh, span)")


def _step_start(e: _E, spec: WarpSpec):
    """Loop head; at a new point f, ∂f/∂t (J and J' from one call, J' parked in the LU's
    slots until W overwrites them)."""
    K = spec.schedule.per_lane
    RUN, OK = int(Status.RUNNING), int(Status.OK)
    e(1, "h = hh", f"st = {RUN} if te > t else {OK}", "e1 = 1.0", "e2 = 1.0", "nacc = 0",
      "nrej = 0", "need_jac = True", f"while st == {RUN}:",
      "    to_end = te - t", "    last = h >= to_end", "    if last:", "        h = to_end",
      "    " + SYNC, "    fresh = need_jac", "    if need_jac:",
      "        tv = table_values(t, p, args)",
      "        dtv = table_values_dt(t, p, args)",
      "        jac_dt_entries(t, p, tv, dtv, sh_j, jb, sh_l, lb)")
    _owned(e, 3, K)
    _matvec(e, 5, "yb", "fv")
    e(5, "f0[q] = fv")
    _matvec(e, 5, "yb", "gv", entries="sh_l", base="lb")
    e(5, "dt[q] = gv")
    e(3, "need_jac = False", SYNC)


def _stage_point(e: _E, spec: WarpSpec, st: int, d: int):
    tab, K = spec.tableau, spec.schedule.per_lane
    a = [(lit(tab.a[st, j]), j) for j in range(st) if tab.a[st, j] != 0.0]
    _owned(e, d, K)
    e(d + 2, "sh_v[yib + r] = sh_v[yb + r]" + "".join(f" + {c} * kk[{j * K} + q]" for c, j in a))
    e(d, f"tj = t + {lit(tab.c[st])} * h",
      f"ev = {tab.c[st] != tab.c[st - 1]}")


def _stage_rhs(e: _E, spec: WarpSpec, st: int, d: int):
    """The solve's right-hand side of stage ``st`` for one owned state (``fv`` its f)."""
    tab, K = spec.tableau, spec.schedule.per_lane
    terms = (["h * " + lit(tab.d[st]) + " * dt[q]"] if tab.d[st] != 0.0 else [])
    terms += [f"({lit(tab.C[st, j])} / h) * kk[{j * K} + q]" for j in range(st)
              if tab.C[st, j] != 0.0]
    e(d, "sh_v[xb + sched[ownp0 + q]] = fv" + "".join(f" + {x}" for x in terms))


def _stages(e: _E, spec: WarpSpec):
    S, K, W = spec.tableau.stages, spec.schedule.per_lane, spec.lanes
    gamma = spec.tableau.gamma
    e(2, f"for sg in range({S}):", "    if sg == 0:", "        tj = t",
      "        ev = not fresh")
    for st in range(1, S):
        e(3, f"elif sg == {st}:")
        _stage_point(e, spec, st, 4)
    e(3, "if sg > 0:", "    " + SYNC, "if ev:",
      "    tv = table_values(tj, p, args)",
      "    jac_entries(tj, p, tv, sh_j, jb)",
      "if sg == 0:",
      f"    inv = 1.0 / (h * {lit(gamma)})",
      f"    for sl in range(lane, {spec.nslots}, {W}):",
      "        code = sched[{WSLOT} + sl]",
      "        ent = code // 2 - 1",
      "        wv = -sh_j[jb + ent] if ent >= 0 else 0.0",
      "        if code % 2 == 1:",
      "            wv += inv",
      "        sh_l[lb + sl] = wv",
      "    " + SYNC)
    _levels(e, 4, spec, "factor")
    _owned(e, 3, K)
    e(5, "if sg == 0:", "    fv = f0[q]", "else:")
    _matvec(e, 6, "yib", "fv")
    for st in range(S):
        e(5, f"{'if' if st == 0 else 'elif'} sg == {st}:")
        _stage_rhs(e, spec, st, 6)
    e(3, SYNC)
    _levels(e, 3, spec, "solve")
    _owned(e, 3, K)
    e(5, f"kk[sg * {K} + q] = sh_v[xb + sched[ownp0 + q]]")


def _error_control(e: _E, spec: WarpSpec):
    tab, ctrl, K, S = spec.tableau, spec.controller, spec.schedule.per_lane, spec.tableau.stages
    k_ctrl = tab.embedded_order + 1.0
    b = [(lit(tab.b[j]), j) for j in range(S) if tab.b[j] != 0.0]
    er = [(lit(tab.e[j]), j) for j in range(S) if tab.e[j] != 0.0]
    comb = " + ".join(f"{c} * kk[{j * K} + q]" for c, j in er) if er else "0.0"
    e(2, "acc = 0.0")
    _owned(e, 2, K)
    e(4, "yv = sh_v[yb + r]",
      "y1[q] = yv" + "".join(f" + {c} * kk[{j * K} + q]" for c, j in b),
      f"ee = {comb}",
      "sc = atol[r] + rtol * _nmax(abs(yv), abs(y1[q]))",
      "rr = weights[r] * ee / sc",
      "acc += rr * rr",
      "if not _isfin(y1[q]):",
      "    acc += math.inf")
    _reduce(e, 2, spec.lanes, "acc", "tot")
    fac = [lit(ctrl.safety)]
    for base, beta in (("err_s", ctrl.beta1), ("e1", ctrl.beta2), ("e2", ctrl.beta3)):
        if beta != 0.0:
            fac.append(f"{base} ** {lit(-beta / k_ctrl)}")
    e(2, "err = math.sqrt(tot / n_weighted)",
      "finite = _isfin(err)",
      "accept = finite and err <= 1.0",
      "err_s = _nmax(err if finite else 1.0, 1e-10)",
      "if accept:",
      f"    fac = _nmin(_nmax({' * '.join(fac)}, {lit(ctrl.factor_min)}), "
      f"{lit(ctrl.factor_max)})",
      "elif finite:",
      f"    fac = _nmin(_nmax({lit(ctrl.safety)} * err_s ** {lit(-1.0 / k_ctrl)}, "
      f"{lit(ctrl.factor_min)}), 1.0)",
      "else:",
      f"    fac = {lit(ctrl.factor_min)}",
      "h_new = h * fac",
      f"dt_min = {lit(ctrl.dt_min_rel)} * _nmax(abs(t), 1.0)")


def _accept(e: _E, spec: WarpSpec):
    tab, K, S = spec.tableau, spec.schedule.per_lane, spec.tableau.stages
    H = tab.H
    if H.shape[0] != 3:
        raise ValueError("the dense-output formula needs exactly 3 H rows")
    OK, RUN = int(Status.OK), int(Status.RUNNING)
    e(2, "if accept:",
      "    while jsv < m and (t_save[i, jsv] <= t + h or last):",
      "        th = (t_save[i, jsv] - t) / h",
      "        om = 1.0 - th")
    _owned(e, 4, K)
    for r in range(3):
        terms = [f"{lit(H[r, j])} * kk[{j * K} + q]" for j in range(S) if H[r, j] != 0.0]
        e(6, f"c{r} = " + (" + ".join(terms) if terms else "0.0"))
    e(6, "ys[i, jsv, r] = om * sh_v[yb + r] + th * (y1[q] + om * (c0 + th * (c1 + th * c2)))")
    e(2, "        jsv += 1",
      "    if last:", "        t = te", "    else:", "        t = t + h")
    _owned(e, 3, K)
    e(5, "sh_v[yb + r] = y1[q]")
    e(2, "    nacc += 1", "    e2 = e1", "    e1 = err_s", "    need_jac = True",
      "    if last:", f"        st = {OK}",
      "else:", "    nrej += 1", "    if h_new < dt_min:",
      f"        st = {int(Status.STEP_TOO_SMALL)} if finite else {int(Status.NON_FINITE)}",
      "h = h_new",
      f"if st == {RUN} and nacc + nrej >= {int(spec.max_steps)}:",
      f"    st = {int(Status.MAX_STEPS)}")
    e(1, "if lane == 0:", "    t_out[i] = t", "    status[i] = st", "    n_accepted[i] = nacc",
      "    n_rejected[i] = nrej", "")


def _jac_kernel(e: _E, spec: WarpSpec):
    """A test kernel: f, J (slot layout) and ∂f/∂t at given points through the warp code."""
    K, W, WPB = spec.schedule.per_lane, spec.lanes, spec.warps_per_block
    e(0, "def jac_kernel(y_in, t_in, params, args, f_out, jv_out, dfdt_out, n_traj, sched):")
    e(1, "tid = cuda.threadIdx.x", f"lane = tid % {W}", f"wb = tid // {W}",
      f"i = cuda.blockIdx.x * {WPB} + wb",
      f"sh_j = cuda.shared.array({WPB * spec.m}, F64)",
      f"sh_l = cuda.shared.array({WPB * spec.nslots}, F64)",
      f"sh_v = cuda.shared.array({WPB * spec.vector_size}, F64)",
      "if i >= n_traj:", "    return",
      f"jb = wb * {spec.m}", f"lb = wb * {spec.nslots}", f"yb = wb * {spec.vector_size}",
      f"own0 = {{OWN}} + lane * {K}",
      f"p = cuda.local.array({spec.n_params}, F64)",
      f"for q in range({spec.n_params}):", "    p[q] = params[i, q]")
    _owned(e, 1, K)
    e(3, "sh_v[yb + r] = y_in[i, r]")
    e(1, SYNC, "t = t_in[i]", "tv = table_values(t, p, args)",
      "dtv = table_values_dt(t, p, args)",
      "jac_dt_entries(t, p, tv, dtv, sh_j, jb, sh_l, lb)")
    _owned(e, 1, K)
    _matvec(e, 3, "yb", "fv")
    e(3, "f_out[i, r] = fv")
    _matvec(e, 3, "yb", "gv", entries="sh_l", base="lb")
    e(3, "dfdt_out[i, r] = gv")
    e(1, f"for sl in range(lane, {spec.nslots}, {W}):",
      "    code = sched[{WSLOT} + sl]",
      "    ent = code // 2 - 1",
      "    jv_out[i, sl] = sh_j[jb + ent] if ent >= 0 else 0.0", "")


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
    """The module text: helpers, ``jac_entries`` / ``jac_dt_entries``, ``kernel`` and
    ``jac_kernel``.  It expects the globals ``cuda``, ``F64``, ``table_values`` and
    ``table_values_dt`` (bound by ``cuda.modules`` on a GPU, by the emulator on a CPU)."""
    ws = spec.schedule
    if spec.n_tv < 1:
        raise ValueError("the warp kernel reads its tables through a TableSplit (n_tv >= 1)")
    e = _E()
    _head(e, spec)
    _initial_step(e, spec)
    _step_start(e, spec)
    _stages(e, spec)
    _error_control(e, spec)
    _accept(e, spec)
    _jac_kernel(e, spec)
    body = "\n".join(e.lines)
    for name, off in ws.offsets.items():
        body = body.replace("{" + name.upper() + "}", str(int(off)))
    shift = ws.offsets["ownp"] - ws.offsets["own"]
    body = body.replace("sched[ownp0 + q]", f"sched[own0 + {shift} + q]")
    head = (f'"""Generated warp kernel: n={spec.n}, P={spec.n_params}, entries={spec.m}, '
            f'nslots={ws.nslots}, lanes={ws.lanes}, warps/block={spec.warps_per_block}, '
            f'levels {ws.n_factor_levels}/{ws.n_forward_levels}/{ws.n_backward_levels}, '
            f'tableau={spec.tableau.name}."""\n'
            "import math\n\nM = math\n\n\n")
    return head + _HELPERS + "\n" + spec.entries_source + "\n\n" + body + "\n"
