"""The Jacobian of a linear right-hand side, derived from its generated source.

The perturbation equations are linear in the state: every generated line is either free of ``y``
(background, table reads, coefficients) or a linear combination of ``y`` with ``y``-free
coefficients.  So J = ∂f/∂y is the matrix of those coefficients, and it can be written down as
straight-line code instead of being recovered by one forward sweep per colour of the sparsity
pattern (22 sweeps of the whole right-hand side for the default model, most of a solver step).

:func:`derive_linear_jacobian` walks the function's syntax tree once.  Each assignment is
classified: ``y``-free lines are kept verbatim; a line linear in ``y`` is replaced by one line per
state it depends on, ``c_<name>_<j> = <coefficient>``, built from the coefficients of the names it
uses.  A product of two ``y``-dependent factors, a ``y``-dependent divisor or a function applied
to ``y`` is not linear and raises :class:`NonlinearSource` naming the line, so a model that stops
being linear fails at generation, not with a wrong Jacobian.  Additive ``y``-free terms are
allowed (an affine right-hand side has the same Jacobian).

The derived function takes no ``y``: ``jacobian(x, p, tab)`` returns the nonzero entries in the
order of ``entries`` (row, column).  Their pattern is structural (an entry is present when the
source mentions it), a superset of the numerical nonzeros, which is what a sparse LU needs.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Callable

from .codegen import compile_source

__all__ = ["NonlinearSource", "LinearJacobianSource", "LinearJacobian", "derive_linear_jacobian",
           "build_linear_jacobian"]


class NonlinearSource(ValueError):
    """The source is not linear in ``y``; the message names the line."""


@dataclass(frozen=True)
class LinearJacobianSource:
    """The derived Jacobian: ``source`` defines ``name(<args without y>)`` returning one value
    per entry of ``entries`` ((row, column) pairs, row-major order)."""

    source: str
    name: str
    args: tuple
    entries: tuple


_ONE = "1.0"
_ATOM = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|[0-9.]+(e[-+]?[0-9]+)?")


def _paren(text: str) -> str:
    """``text`` as a factor: bare if it is a name or a non-negative number, else parenthesised."""
    return text if _ATOM.fullmatch(text) else f"({text})"


def _mul(coef: str, factor: str) -> str:
    if coef == _ONE:
        return factor
    if factor == _ONE:
        return coef
    return f"{coef} * {factor}"


class _Walker:
    """Coefficients of the expressions of one function body, by syntax node."""

    def __init__(self, y: str):
        self.y = y
        self.linear: dict[str, dict[int, str]] = {}  # name -> {column: coefficient name}
        self.line = ""

    def fail(self, what: str):
        raise NonlinearSource(f"not linear in {self.y}: {what} in line `{self.line}`")

    def coefficients(self, node) -> dict[int, str] | None:
        """{column: coefficient text} of a y-dependent expression, or None if y-free."""
        if isinstance(node, ast.Name):
            if node.id == self.y:
                self.fail(f"{self.y} used as a whole")
            return self.linear.get(node.id)
        if isinstance(node, ast.Constant):
            return None
        if isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Name) and node.value.id == self.y:
                if not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)):
                    self.fail(f"{self.y} indexed by something other than an integer literal")
                return {node.slice.value: _ONE}
            return self._free(node, "an index")
        if isinstance(node, ast.UnaryOp):
            inner = self.coefficients(node.operand)
            if inner is None or isinstance(node.op, ast.UAdd):
                return inner
            if isinstance(node.op, ast.USub):
                return {j: f"-{_paren(c)}" for j, c in inner.items()}
            self.fail(f"operator {type(node.op).__name__} applied to {self.y}")
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        return self._free(node, f"a {type(node).__name__}")

    def _free(self, node, what):
        for child in ast.walk(node):
            if child is node:
                continue
            if isinstance(child, ast.expr) and self._mentions_y(child):
                self.fail(f"{self.y} inside {what}")
        return None

    def _mentions_y(self, node) -> bool:
        return isinstance(node, ast.Name) and (node.id == self.y or node.id in self.linear)

    def _binop(self, node: ast.BinOp):
        left, right = self.coefficients(node.left), self.coefficients(node.right)
        if left is None and right is None:
            return None
        if isinstance(node.op, (ast.Add, ast.Sub)):
            sign = "-" if isinstance(node.op, ast.Sub) else "+"
            out = dict(left or {})
            for j, c in (right or {}).items():
                out[j] = f"{out[j]} {sign} {_paren(c)}" if j in out else \
                    (c if sign == "+" else f"-{_paren(c)}")
            return out
        if isinstance(node.op, ast.Mult):
            if left is not None and right is not None:
                self.fail(f"a product of two {self.y}-dependent factors")
            lin, other = (left, node.right) if left is not None else (right, node.left)
            factor = _paren(ast.unparse(other))
            return {j: _mul(_paren(c), factor) for j, c in lin.items()}
        if isinstance(node.op, ast.Div):
            if right is not None:
                self.fail(f"division by a {self.y}-dependent expression")
            den = _paren(ast.unparse(node.right))
            return {j: f"{_paren(c)} / {den}" for j, c in left.items()}
        self.fail(f"operator {type(node.op).__name__} on {self.y}")


def derive_linear_jacobian(source: str, function: str, y: str = "y",
                           name: str = "jacobian") -> LinearJacobianSource:
    """The Jacobian of ``function`` (defined in ``source``) with respect to its argument ``y``.

    ``function`` must be straight-line: assignments to names (or tuples of names from y-free
    calls), an optional docstring, and ``return (expr, ...)`` of one expression per state.
    Returns the source of ``name(<the other arguments>)``.
    """
    tree = ast.parse(source)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    if not defs:
        raise ValueError(f"source defines no function {function!r}")
    fn = defs[0]
    args = tuple(a.arg for a in fn.args.args)
    if y not in args:
        raise ValueError(f"{function} has no argument {y!r}")
    walker = _Walker(y)
    lines: list[str] = []
    rows = None
    for stmt in fn.body:
        walker.line = ast.unparse(stmt)
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # docstring
        if isinstance(stmt, ast.Return):
            if not isinstance(stmt.value, ast.Tuple):
                raise ValueError(f"{function} must return a tuple literal")
            rows = [walker.coefficients(el) for el in stmt.value.elts]
            break
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            raise ValueError(f"{function} is not straight-line: `{walker.line}`")
        target = stmt.targets[0]
        coefs = walker.coefficients(stmt.value)
        if coefs is None:
            if isinstance(target, ast.Name):
                walker.linear.pop(target.id, None)
            lines.append(f"    {walker.line}")
            continue
        if not isinstance(target, ast.Name):
            walker.fail("a y-dependent value assigned to a tuple")
        names = {}
        for j in sorted(coefs):
            cname = f"c_{target.id}_{j}"
            lines.append(f"    {cname} = {coefs[j]}")
            names[j] = cname
        walker.linear[target.id] = names
    if rows is None:
        raise ValueError(f"{function} has no return statement")
    entries, values = [], []
    for i, row in enumerate(rows):
        for j, c in sorted((row or {}).items()):
            entries.append((i, j))
            values.append(c)
    rest = [a for a in args if a != y]
    head = [f"def {name}({', '.join(rest)}):",
            f'    """Entries of d {function} / d {y} (derived from {function}\'s linear source)."""']
    ret = "    return (" + ", ".join(values) + ("," if len(values) == 1 else "") + ")"
    return LinearJacobianSource(source="\n".join(head + lines + [ret]) + "\n", name=name,
                                args=tuple(rest), entries=tuple(entries))


@dataclass(frozen=True)
class LinearJacobian:
    """J = ∂f/∂y of a linear, table-reading right-hand side, as a solver may use it.

    Contract (the solver looks for it as ``rhs.linear_jacobian``; it knows nothing else of the
    model): ``rows``/``cols`` (length m) are the structural nonzeros of J, every entry the rhs
    can make nonzero; ``values(t, p, tab)`` returns their m values as a tuple (JAX), equal to
    ``jax.jacfwd`` of the rhs at any y to rounding; ``core(t, p, tv)`` and ``core_device`` the
    same given the interpolated table values ``tv`` of the rhs's table split (JAX and
    math/builtins flavours, as ``models.tables.TableSplit``), ``device_source`` their text.
    """

    rows: tuple
    cols: tuple
    values: Callable = field(repr=False)
    core: Callable = field(repr=False)
    core_device: Callable = field(repr=False)
    device_source: str = field(repr=False, default="")

    @property
    def nnz(self) -> int:
        return len(self.rows)


def build_linear_jacobian(rhs_source: str, split_source: str, jax_namespace: dict,
                          device_namespace: dict) -> LinearJacobian:
    """Derive and compile J of ``rhs`` (in ``rhs_source``) and of ``rhs_core`` (the table-free
    core in ``split_source``); both must give the same entries."""
    full = derive_linear_jacobian(rhs_source, "rhs", name="jacobian")
    core = derive_linear_jacobian(split_source, "rhs_core", name="jacobian_core")
    if full.entries != core.entries:
        raise AssertionError("the rhs and its table-free core have different Jacobian entries")
    (values,) = compile_source(full.source, ("jacobian",), jax_namespace, tag="eb_jacobian")
    (core_j,) = compile_source(core.source, ("jacobian_core",), jax_namespace,
                               tag="eb_jacobian_core")
    (core_d,) = compile_source(core.source, ("jacobian_core",), device_namespace,
                               tag="eb_jacobian_device")
    rows, cols = zip(*full.entries) if full.entries else ((), ())
    return LinearJacobian(rows=tuple(rows), cols=tuple(cols), values=values, core=core_j,
                          core_device=core_d, device_source=core.source)
