"""The monomials of a declared Jacobian as device functions of the warp kernel.

``solver.linalg.entry_terms`` writes every entry of J as Σ c_t G_m over M monomials G of a few
dozen y-free atoms.  The warp kernel needs the monomials at a time t, and at the start of a step
also their t-derivatives:

* ``mono_eval(x, p, tv, g)``: ``g[m] = G_m(x)``;
* ``mono_dt_eval(x, p, tv, dtv, g)``: the same and ``g[M + m] = dG_m/dx`` -- the atoms' tangents
  by :func:`solver.linalg.forward_mode.tangent_source` (seeds x' = 1, tv' = ``dtv``, the table's
  d tv/dx), the monomials' by the product rule.

Every lane runs them whole and stores the same values, so a lane may read any ``g`` right after
its own call.
"""
from __future__ import annotations

import ast

from ....linalg.forward_mode import tangent_source

__all__ = ["monomial_functions", "check_homogeneous"]


def _body(source: str) -> tuple[list[str], list[str]]:
    """(assignment lines, returned expressions) of the one function in ``source``."""
    fn = [f for f in ast.parse(source).body if isinstance(f, ast.FunctionDef)][0]
    lines, ret = [], None
    for st in fn.body:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue
        if isinstance(st, ast.Return):
            ret = [ast.unparse(e) for e in st.value.elts]
            break
        lines.append("    " + ast.unparse(st))
    return lines, ret


def _product(factors: list[str]) -> str:
    return " * ".join(factors) if factors else "1.0"


def monomial_functions(terms) -> str:
    """Module text defining ``mono_eval`` and ``mono_dt_eval`` for an ``EntryTerms``."""
    M = len(terms.monomials)
    lines, atoms = _body(terms.atom_source)
    head = ["def mono_eval(x, p, tv, g):",
            '    """The monomials of the declared Jacobian at x (generated)."""'] + lines
    for m, mono in enumerate(terms.monomials):
        head.append(f"    g[{m}] = {_product([atoms[a] for a in mono])}")
    tsrc = tangent_source(terms.atom_source, "atoms", {"x": "1.0", "tv": ("array", "dtv")},
                          "atoms_dt")
    tlines, tret = _body(tsrc.source)
    na = len(atoms)
    vals, dvals = tret[:na], tret[na:]
    dt = ["def mono_dt_eval(x, p, tv, dtv, g):",
          '    """The monomials and their x-derivatives (generated)."""'] + tlines
    dt += [f"    a__{i} = {v}" for i, v in enumerate(vals)]
    dt += [f"    da__{i} = {v}" for i, v in enumerate(dvals)]
    for m, mono in enumerate(terms.monomials):
        dt.append(f"    g[{m}] = {_product([f'a__{a}' for a in mono])}")
        parts = []
        for j, a in enumerate(mono):
            rest = [f"a__{b}" for i, b in enumerate(mono) if i != j]
            parts.append(_product([f"da__{a}"] + rest))
        dt.append(f"    g[{M + m}] = {' + '.join(parts) if parts else '0.0'}")
    return "\n".join(head) + "\n\n\n" + "\n".join(dt) + "\n"


def check_homogeneous(rhs_core, n: int, P: int, n_tv: int) -> None:
    """The warp kernel computes f = J y, so the rhs (its table-free core, device flavour) must
    have no y-free term: f(0) = 0 at a random point."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = float(rng.uniform(-5.0, -1.0))
    p = tuple(float(v) for v in rng.uniform(0.5, 2.0, max(P, 1)))
    tv = tuple(float(v) for v in rng.uniform(-1.0, 1.0, n_tv))
    f0 = np.asarray(rhs_core(tuple(0.0 for _ in range(n)), x, p, tv), np.float64)
    if np.any(f0 != 0.0):
        raise ValueError("the rhs is affine, not linear, in y (f(0) != 0): the warp kernel "
                         "computes f = J y and cannot run it")
