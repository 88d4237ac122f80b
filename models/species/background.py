"""The wavenumber, the scale factor and the tabulated background/thermodynamics.

Not a species: it owns no state, only the parameters that place the mode and its table (k, the
table row and the ln a grid), and the first lines of the rhs, which every emitter uses: ℋ,
1/tau, kappa', c_s^2 from the table reads (models/table_reads.py), a and its inverse powers.
"""
from __future__ import annotations

from ..codegen import Emitter
from ..table_reads import TableReads, table_reads
from .base import Layout, Observables


class Background:
    params = ("k", "cosmo_row", "table_x_min", "table_dx")

    def emit(self, e: Emitter, L: Layout) -> tuple[TableReads, int, int]:
        """Emit the lines; returns the reads and their span in ``e.lines`` (start, end)."""
        e.comment("background and thermodynamics: cubic Hermite on the uniform ln a table")
        e("k", L.p("k"))
        e("k2", "k * k")
        reads = table_reads(L.p("cosmo_row"), L.p("table_x_min"), L.p("table_dx"))
        start = len(e.lines)
        e.lines += reads.lines
        end = len(e.lines)
        e("cH", "M.exp(tab_ln_conformal_hubble)")
        e("icH", "1.0 / cH")
        e("itau", "M.exp(-tab_ln_conformal_time)")
        e("kd", "M.exp(tab_ln_kappa_dot)")
        e("cs2b", "tab_cs2_b")
        e("a", "M.exp(x)")
        e("ia", "1.0 / a")
        e("ia2", "ia * ia")
        return reads, start, end

    def observables(self, L: Layout, obs: Observables):
        obs.add("background", "a", "a")
        obs.add("background", "conformal_hubble", "cH")
