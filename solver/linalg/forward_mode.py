"""Forward-mode derivatives of straight-line code, as straight-line code.

The warp kernel evaluates a declared Jacobian's entries J(t) from generated straight-line text
(``rhs.linear_jacobian.device_source``) and needs ∂J/∂t for the Rosenbrock stages.  Enzyme
could differentiate the device function, but only on a GPU and at a compile cost of minutes;
the entries' text is simple enough to differentiate by rule, once, on the host, where the
result can be checked against ``jax.jvp``.

:func:`tangent_source` walks a function of assignments and one ``return (e0, e1, ...)`` and emits
a function that returns the primal values followed by their tangents.  The seeds say which
inputs move: a scalar argument with a literal tangent (``{"x": "1.0"}``), an array argument whose
element ``a[i]`` has tangent ``da[i]`` (``{"tv": "dtv"}``: ``dtv`` becomes a new argument), all
else constant.  Zero tangents are propagated symbolically, so inactive lines cost nothing.
Rules: ``+ - * /``, unary minus, ``** c`` with a constant ``c``, ``M.exp``, ``M.sqrt``,
``M.log``; any other call is allowed only on inactive operands (it raises
:class:`NotDifferentiable` otherwise, naming the line).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from .straight_line import read

__all__ = ["NotDifferentiable", "TangentSource", "tangent_source"]


class NotDifferentiable(ValueError):
    """The source uses an operation the rules do not cover on an active value."""


@dataclass(frozen=True)
class TangentSource:
    """``source`` defines ``name(*args)``; it returns the ``n_out`` primal outputs, then their
    ``n_out`` tangents (a zero tangent is the literal 0.0)."""

    source: str
    name: str
    args: tuple
    n_out: int


def _p(text: str) -> str:
    return f"({text})"


class _Tangents:
    def __init__(self, scalar_seeds: dict, array_seeds: dict):
        self.scalar = dict(scalar_seeds)   # name -> tangent text
        self.array = dict(array_seeds)     # array name -> tangent array name
        self.active: dict[str, str] = {}   # assigned name -> its tangent variable
        self.line = ""

    def fail(self, what: str):
        raise NotDifferentiable(f"{what} in line `{self.line}`")

    def of(self, node) -> str | None:
        """Tangent text of an expression, None where it is zero."""
        if isinstance(node, ast.Constant):
            return None
        if isinstance(node, ast.Name):
            if node.id in self.active:
                return self.active[node.id]
            return self.scalar.get(node.id)
        if isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Name) and node.value.id in self.array:
                return f"{self.array[node.value.id]}[{ast.unparse(node.slice)}]"
            self._inactive(node, "an index")
            return None
        if isinstance(node, ast.UnaryOp):
            inner = self.of(node.operand)
            if inner is None or isinstance(node.op, ast.UAdd):
                return inner
            if isinstance(node.op, ast.USub):
                return f"-{_p(inner)}"
            self.fail(f"operator {type(node.op).__name__}")
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        self._inactive(node, f"a {type(node).__name__}")
        return None

    def _inactive(self, node, what):
        for child in ast.walk(node):
            if child is not node and isinstance(child, ast.expr) and \
                    not isinstance(child, ast.Subscript) and self.of_leaf(child):
                self.fail(f"an active value inside {what}")

    def of_leaf(self, node) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.active or node.id in self.scalar or node.id in self.array
        return False

    def _binop(self, node: ast.BinOp):
        da, db = self.of(node.left), self.of(node.right)
        if da is None and db is None:
            return None
        a, b = _p(ast.unparse(node.left)), _p(ast.unparse(node.right))
        op = node.op
        if isinstance(op, ast.Add):
            return da if db is None else db if da is None else f"{da} + {db}"
        if isinstance(op, ast.Sub):
            return da if db is None else f"-{_p(db)}" if da is None else f"{da} - {_p(db)}"
        if isinstance(op, ast.Mult):
            terms = ([f"{_p(da)} * {b}"] if da is not None else []) + \
                    ([f"{a} * {_p(db)}"] if db is not None else [])
            return " + ".join(terms)
        if isinstance(op, ast.Div):
            if db is None:
                return f"{_p(da)} / {b}"
            quot = f"{a} / {b}"
            if da is None:
                return f"-{_p(quot)} * {_p(db)} / {b}"
            return f"({_p(da)} - {_p(quot)} * {_p(db)}) / {b}"
        if isinstance(op, ast.Pow):
            if db is not None or not isinstance(node.right, (ast.Constant, ast.UnaryOp)):
                self.fail("a power with an active or non-constant exponent")
            c = ast.unparse(node.right)
            return f"{_p(c)} * {a} ** ({c} - 1.0) * {_p(da)}"
        self.fail(f"operator {type(op).__name__}")

    def _call(self, node: ast.Call, primal: str | None = None):
        """Tangent of ``M.exp/sqrt/log(u)``; ``primal``: a name already holding the call's value."""
        func = ast.unparse(node.func)
        active = [self.of(a) for a in node.args]
        if all(d is None for d in active):
            return None
        if func not in ("M.exp", "M.sqrt", "M.log") or len(node.args) != 1:
            self.fail(f"the call {func} on an active value")
        du = active[0]
        u = _p(ast.unparse(node.args[0]))
        value = primal if primal is not None else _p(ast.unparse(node))
        if func == "M.exp":
            return f"{value} * {_p(du)}"
        if func == "M.sqrt":
            return f"0.5 * {_p(du)} / {value}"
        return f"{_p(du)} / {u}"


def tangent_source(source: str, function: str, seeds: dict, name: str,
                   prefix: str = "d__") -> TangentSource:
    """The forward-mode derivative of ``function`` (straight-line, defined in ``source``).

    ``seeds``: {argument: tangent}; a tangent is a literal text for a scalar argument (e.g.
    ``"1.0"``) or ``("array", "d_name")`` for an array argument whose elements move with the new
    argument ``d_name`` (appended to the signature in the order of ``seeds``).  The returned
    function takes the original arguments, then those tangent arrays, and returns the primal
    outputs followed by their tangents.  The tangent of a name ``v`` is ``<prefix>v``; no name of
    the source may start with ``prefix`` (a second derivative needs a prefix of its own).
    """
    fn = read(source, function)
    args = fn.args
    clash = sorted({n.id for _, v, _ in fn.assignments for n in ast.walk(v)
                    if isinstance(n, ast.Name) and n.id.startswith(prefix)}
                   | {t for t, _, _ in fn.assignments if t.startswith(prefix)})
    if clash:
        raise ValueError(f"tangent_source: names {clash[:3]} already start with {prefix!r}")
    scalar, array = {}, {}
    for arg, seed in seeds.items():
        if arg not in args:
            raise ValueError(f"{function} has no argument {arg!r} to seed")
        if isinstance(seed, tuple):
            if len(seed) != 2 or seed[0] != "array":
                raise ValueError(f"array seed must be ('array', name), got {seed!r}")
            array[arg] = seed[1]
        else:
            scalar[arg] = str(seed)
    tg = _Tangents(scalar, array)
    lines = []
    for target, value, line in fn.assignments:
        tg.line = line
        d = tg._call(value, primal=target) if isinstance(value, ast.Call) else tg.of(value)
        lines.append(f"    {line}")
        if d is None:
            tg.active.pop(target, None)
        else:
            dname = f"{prefix}{target}"
            lines.append(f"    {dname} = {d}")
            tg.active[target] = dname
    out = fn.returns
    primal = [ast.unparse(e) for e in out]
    tangents = []
    for e in out:
        tg.line = ast.unparse(e)
        d = tg.of(e)
        tangents.append("0.0" if d is None else d)
    new_args = args + tuple(array.values())
    head = [f"def {name}({', '.join(new_args)}):",
            f'    """{function} and its forward-mode tangent (generated by solver.linalg.'
            'forward_mode)."""']
    everything = primal + tangents
    ret = "    return (" + ", ".join(everything) + ("," if len(everything) == 1 else "") + ")"
    return TangentSource(source="\n".join(head + lines + [ret]) + "\n", name=name,
                         args=new_args, n_out=len(out))
