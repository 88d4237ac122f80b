"""Reading generated straight-line functions: assignments to names and one tuple return.

The generated sources the solver transforms (a declared Jacobian's entries, their monomials,
forward-mode tangents of either) share one shape: ``def f(args): [docstring] name = expr ...
return (e0, e1, ...)``.  :func:`read` checks that shape once and hands back the pieces.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

__all__ = ["StraightLine", "read"]


@dataclass(frozen=True)
class StraightLine:
    """``args``: the parameter names; ``assignments``: (target, value node, source line);
    ``returns``: the returned expressions (nodes)."""

    name: str
    args: tuple
    assignments: tuple
    returns: tuple


def read(source: str, function: str | None = None) -> StraightLine:
    """The function ``function`` of ``source`` (the only one if None), checked straight-line."""
    fns = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    if function is not None:
        fns = [f for f in fns if f.name == function]
    if len(fns) != 1:
        raise ValueError(f"source defines no function {function!r}" if function else
                         "source must define exactly one function")
    fn = fns[0]
    assignments, returns = [], None
    for stmt in fn.body:
        line = ast.unparse(stmt)
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if isinstance(stmt, ast.Return):
            if not isinstance(stmt.value, ast.Tuple):
                raise ValueError(f"{fn.name} must return a tuple literal")
            returns = tuple(stmt.value.elts)
            break
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            raise ValueError(f"{fn.name} is not straight-line: `{line}`")
        assignments.append((stmt.targets[0].id, stmt.value, line))
    if returns is None:
        raise ValueError(f"{fn.name} has no return statement")
    return StraightLine(fn.name, tuple(a.arg for a in fn.args.args), tuple(assignments), returns)
