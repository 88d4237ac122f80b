"""A declared Jacobian's entries as sums of products: J_e(t) = Σ_t c_t · G_m(t)(t).

The derived Jacobian of a linear right-hand side (``rhs.linear_jacobian.device_source``) is
straight-line code: a prefix of y-free lines (background, table reads: the *atoms*) and
coefficient lines ``c_<name>_<j> = ...`` that combine atoms, constants and earlier coefficients
with ``+ - *`` and divisions.  Expanding every coefficient into a polynomial in the atoms writes
each entry as a short sum of constant multiples of a few *monomials* (products of atoms), shared
by many entries: the hierarchies' k/ℋ, κ'/ℋ, the metric's A_X/ℋ²...

That is what lets the lanes of a warp split J: every lane computes the atoms (one short prefix)
and the M monomials, then evaluates only its own rows' entries from a table of (constant,
monomial) terms -- a few hundred operations instead of all m entries' straight-line code in
every lane.  A division by an atom, or by a y-free expression, becomes a new atom (its
reciprocal), so the monomials have no negative powers.

:func:`expand_entries` returns an :class:`EntryTerms`: the prefix source (``atoms(x, p, tv)``
returning the atoms), the monomials as atom-index tuples, and per entry its (constant,
monomial) terms.  ``evaluate`` recomputes the entries from them (tests).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .straight_line import read

__all__ = ["EntryTerms", "expand_entries"]


@dataclass(frozen=True)
class EntryTerms:
    """``atom_source`` defines ``atoms(x, p, tv)`` returning ``atom_names`` in order;
    ``monomials[m]`` the atom indices multiplied (() = 1); ``terms[e]`` the (constant,
    monomial) pairs of entry e."""

    atom_source: str
    atom_names: tuple
    monomials: tuple
    terms: tuple = field(repr=False)

    @property
    def n_terms(self) -> int:
        return sum(len(t) for t in self.terms)

    def evaluate(self, atom_values) -> list[float]:
        """The entries from atom values (a sequence in ``atom_names`` order)."""
        g = []
        for mono in self.monomials:
            v = 1.0
            for a in mono:
                v *= atom_values[a]
            g.append(v)
        return [sum(c * g[m] for c, m in ts) for ts in self.terms]


class _Expander:
    def __init__(self, coef_prefix: str):
        self.prefix = coef_prefix
        self.atoms: list[str] = []          # atom names in definition order
        self.atom_lines: list[str] = []
        self.polys: dict[str, dict] = {}    # coefficient name -> {monomial: constant}
        self.fresh = 0
        self.line = ""

    def atom(self, name: str, line: str | None = None) -> dict:
        if name not in self.atoms:
            self.atoms.append(name)
            if line is not None:
                self.atom_lines.append(line)
        return {(name,): 1.0}

    def new_atom(self, expr_text: str) -> dict:
        for i, line in enumerate(self.atom_lines):
            if line.endswith(f" = {expr_text}") and line.strip().startswith("g__"):
                return {(line.strip().split(" = ")[0],): 1.0}
        self.fresh += 1
        name = f"g__{self.fresh}"
        return self.atom(name, f"    {name} = {expr_text}")

    def mentions_coef(self, node) -> bool:
        return any(isinstance(n, ast.Name) and n.id in self.polys for n in ast.walk(node))

    def poly(self, node) -> dict:
        if isinstance(node, ast.Constant):
            return {(): float(node.value)}
        if isinstance(node, ast.Name):
            if node.id in self.polys:
                return self.polys[node.id]
            return self.atom(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            p = self.poly(node.operand)
            return {m: -c for m, c in p.items()} if isinstance(node.op, ast.USub) else p
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, (ast.Add, ast.Sub)):
                a, b = self.poly(node.left), self.poly(node.right)
                out = dict(a)
                sign = 1.0 if isinstance(node.op, ast.Add) else -1.0
                for m, c in b.items():
                    out[m] = out.get(m, 0.0) + sign * c
                return out
            if isinstance(node.op, ast.Mult):
                a, b = self.poly(node.left), self.poly(node.right)
                out: dict = {}
                for ma, ca in a.items():
                    for mb, cb in b.items():
                        m = tuple(sorted(ma + mb))
                        out[m] = out.get(m, 0.0) + ca * cb
                return out
            if isinstance(node.op, ast.Div):
                if self.mentions_coef(node.right):
                    raise ValueError(f"division by a coefficient in `{self.line}`")
                num = self.poly(node.left)
                if isinstance(node.right, ast.Constant):
                    return {m: c / float(node.right.value) for m, c in num.items()}
                inv = self.new_atom(f"1.0 / ({ast.unparse(node.right)})")
                ((m_inv, _),) = inv.items()
                return {tuple(sorted(m + m_inv)): c for m, c in num.items()}
        if self.mentions_coef(node):
            raise ValueError(f"cannot expand `{ast.unparse(node)}` in `{self.line}`")
        return self.new_atom(ast.unparse(node))


def expand_entries(device_source: str, coef_prefix: str = "c_") -> EntryTerms:
    """Expand the entries of a declared Jacobian's straight-line source (module docstring)."""
    fn = read(device_source)
    args = fn.args
    ex = _Expander(coef_prefix)
    for name, value, line in fn.assignments:
        ex.line = line
        if name.startswith(coef_prefix) or ex.mentions_coef(value):
            ex.polys[name] = ex.poly(value)
        else:
            ex.atom_lines.append(f"    {line}")
            if name not in ex.atoms:
                ex.atoms.append(name)
    out = fn.returns
    polys = [ex.poly(e) for e in out]
    monomials: dict[tuple, int] = {(): 0}
    index = {a: i for i, a in enumerate(ex.atoms)}
    terms = []
    for p in polys:
        ts = []
        for mono, c in sorted(p.items()):
            if c == 0.0:
                continue
            key = tuple(index[a] for a in mono)
            m = monomials.setdefault(key, len(monomials))
            ts.append((c, m))
        terms.append(tuple(ts))
    ret = "    return (" + ", ".join(ex.atoms) + ("," if len(ex.atoms) == 1 else "") + ")"
    src = "\n".join([f"def atoms({', '.join(args)}):",
                     '    """The y-free atoms of a declared Jacobian (solver.linalg.entry_terms)."""']
                    + ex.atom_lines + [ret]) + "\n"
    return EntryTerms(atom_source=src, atom_names=tuple(ex.atoms),
                      monomials=tuple(monomials), terms=tuple(terms))
