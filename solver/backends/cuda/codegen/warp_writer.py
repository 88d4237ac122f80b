"""The building blocks of the warp kernels' text: a lane's owned rows, its rows of J times a
shared vector, reductions, the level-by-level factorisation and the two triangular solves.

Every block is straight-line text over the schedule's fields (``warp_schedule``): a field is one
row of ``lanes`` values, read by lane L at ``table[L + offset]`` with a literal offset and
unsigned indices (``U64``), so numba-cuda-mlir emits neither loop bookkeeping nor negative-index
wrapping for it.  ``codegen.warp`` composes them into the plain and the sensitivity kernel.
"""
from __future__ import annotations

__all__ = ["SYNC", "BSYNC", "Writer", "field", "real_field"]

#: the synchronisation statements (the emulator replaces exactly these lines): a warp's, and a
#: block's (the sensitivity kernel's warps of one trajectory)
SYNC = "cuda.syncwarp()"
BSYNC = "cuda.syncthreads()"

#: the sensitivity kernel's shared arrays of which every warp (direction) has its own part,
#: interleaved: element j of warp w at j * dir_warps + w, so one register (the warp's index Wp)
#: addresses all of them
_PER_WARP = frozenset({"sh_s", "sh_si", "sh_xs", "sh_g", "sh_gs", "sh_r"})


def field(off: int) -> str:
    """The lane's value of the uint32 field at ``off``."""
    return f"U64(sched[L + U64({off})])"


def real_field(off: int) -> str:
    return f"sched_f[L + U64({off})]"


class Writer:
    """Indented lines of one kernel, with the schedule at hand."""

    def __init__(self, spec, sens: bool):
        self.s, self.ws, self.sens = spec, spec.schedule, sens
        self.K, self.n = spec.schedule.per_lane, spec.n
        self.lines: list[str] = []

    def ix(self, array: str, index: str) -> str:
        """``array[index]``; in the sensitivity kernel a per-warp array's element of the warp."""
        if not (self.sens and array in _PER_WARP):
            return f"{array}[{index}]"
        index = f"({index})" if " " in index else index
        return f"{array}[{index} * U64({self.s.dir_warps}) + Wp]"

    def primal(self, lines: list[str]) -> list[str]:
        """``lines`` about the trajectory's state y: in the sensitivity kernel only its primal
        warp (warp 0) runs them, and the others read what it leaves in shared memory."""
        if not (self.sens and lines):
            return lines
        return ["if P0:"] + ["    " + ln for ln in lines]

    def bsync(self) -> str:
        """The barrier after which the trajectory's shared state is seen by all its lanes: the
        warp's, or in the sensitivity kernel the block's."""
        return BSYNC if self.sens else SYNC

    def __call__(self, d: int, *texts: str):
        for t in texts:
            self.lines.append("    " * d + t)

    def rows(self, d: int, body, guard: bool = True):
        """``body(q)`` lines for each owned row q (registers r{q}, p{q}, dg{q}); ``guard``:
        only real rows (r < n). Rows are dealt to the lanes in order, so only the last q can
        have lanes without a row: the others need no test (fewer branches to compile: each is
        a basic block for numba's SSA passes, most of the kernels' compile time)."""
        for q in range(self.K):
            lines = body(q)
            if not lines:
                continue
            if guard and (q + 1) * self.s.lanes > self.n:
                self(d, f"if r{q} < U64({self.n}):")
                self(d + 1, *lines)
            else:
                self(d, *lines)

    def entries(self, q: int, vec: str, out: str, g: str = "sh_g", mono0: int = 0,
                store: bool = False, by_position: bool = False, add: bool = False):
        """Lines: ``out`` (+)= row q of the matrix whose entries are the schedule's terms over
        ``g[mono0 + m]``, times the shared vector ``vec`` (indexed by column, or by the column's
        elimination position with ``by_position``); ``store``: each entry also into ``sh_j``."""
        L = [] if add else [f"{out} = 0.0"]
        for ent in self.ws.entries[q]:
            terms = [f"{real_field(c)} * {self.ix(g, f'U64({mono0}) + {field(mo)}')}"
                     for c, mo in zip(ent.coefs, ent.monos)]
            L.append(f"jv = {' + '.join(terms) if terms else '0.0'}")
            if store:
                L.append(f"sh_j[{field(ent.index)}] = jv")
            col = ent.colpos if by_position else ent.col
            L.append(f"{out} += jv * {self.ix(vec, field(col))}")
        return L

    def reduce(self, d: int, acc: str, out: str):
        """``out`` = the sum of every lane's ``acc``: over the warp, and in the sensitivity
        kernel then over the block's warps (in warp order, so every lane gets the same bits)."""
        self(d, f"{self.ix('sh_r', 'L')} = {acc}", SYNC, "tot = 0.0")
        lane = (lambda ln: f"U64({ln})") if self.sens else str
        self(d, *[f"tot += {self.ix('sh_r', lane(ln))}" for ln in range(self.s.lanes)])
        if self.sens:
            self(d, "if L == U64(0):", "    sh_t[Wp] = tot", BSYNC, "tot = 0.0",
                 "for kw in range(nw):", "    tot += sh_t[kw]", BSYNC, f"{out} = tot")
        else:
            self(d, SYNC, f"{out} = tot")

    def norm(self, d: int, parts, out: str):
        """``out`` = sqrt(Σ_parts Σ_rows (w e / sc)² / n_weighted): ``parts`` are (value(q),
        ya(q), yb(q), atol, weights, primal) -- one for y (primal: in the sensitivity kernel
        its warp 0 only), one for s (the joint norm)."""
        self(d, "acc = 0.0")
        for value, ya, yb, atol, wts, primal in parts:
            def body(q):
                lines = [f"sc = {atol}[r{q}] + rtol * _nmax(abs({ya(q)}), abs({yb(q)}))",
                         f"rr = {wts}[r{q}] * ({value(q)}) / sc", "acc += rr * rr"]
                return self.primal(lines) if primal else lines
            self.rows(d, body)
        self.reduce(d, "acc", "tot")
        self(d, f"{out} = math.sqrt(tot / n_weighted)")

    def factor(self, d: int):
        for lv, level in enumerate(self.ws.factor):
            self(d, f"# factor level {lv}")
            for rd in level:
                self(d, f"hd = {field(rd.head)}", "dst = hd & M16", "acc = sh_l[dst]")
                for pr in rd.pairs:
                    self(d, f"pr = {field(pr)}", "acc -= sh_l[pr & M16] * sh_l[pr >> S16]")
                if 1 in rd.ops:
                    self(d, "if (hd >> S16) == U64(1):",
                         f"    acc = acc * sh_l[{field(rd.aux)}]")
                if 2 in rd.ops:
                    self(d, "if (hd >> S16) == U64(2):", "    acc = 1.0 / acc")
                self(d, "sh_l[dst] = acc")
            self(d, SYNC)
        for at in self.ws.uscale:
            self(d, f"pr = {field(at)}", "sh_l[pr & M16] = sh_l[pr & M16] * sh_l[pr >> S16]")
        self(d, SYNC)

    def solve(self, d: int, x: str = "sh_x"):
        """The shared vector ``x`` (elimination order) overwritten by W⁻¹ x."""
        def levels(lv_list, what):
            for lv, level in enumerate(lv_list):
                self(d, f"# {what} level {lv}")
                for rd in level:
                    self(d, f"kr = {field(rd.head)}", f"acc = {self.ix(x, 'kr')}")
                    for pr in rd.pairs:
                        self(d, f"pr = {field(pr)}",
                             f"acc -= sh_l[pr & M16] * {self.ix(x, 'pr >> S16')}")
                    self(d, f"{self.ix(x, 'kr')} = acc")
                self(d, SYNC)

        levels(self.ws.forward, "forward")
        self.rows(d, lambda q: [f"{self.ix(x, f'p{q}')} = {self.ix(x, f'p{q}')} * sh_l[dg{q}]"],
                  guard=False)
        self(d, SYNC)
        levels(self.ws.backward, "backward")
