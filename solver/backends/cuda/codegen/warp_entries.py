"""The declared Jacobian's entries as device functions of the warp kernel.

From ``rhs.linear_jacobian.device_source`` (``jacobian_core(x, p, tv)`` returning the m entries
of J = ∂f/∂y given the interpolated table values) come two functions that store into a shared
array at a warp's offset:

* ``jac_entries(x, p, tv, out, ob)``: ``out[ob + e] = J_e(x)``;
* ``jac_dt_entries(x, p, tv, dtv, out, ob, dout, db)``: the same, and ``dout[db + e] = dJ_e/dx``
  through x and the table (``dtv`` = d tv/dx of ``table_values_dt``), by
  :func:`solver.linalg.forward_mode.tangent_source`.

Every lane of a warp runs them whole (the same instruction stream, no divergence) and stores
the same values, so a lane may read any entry right after its own call.
"""
from __future__ import annotations

import ast

from ....linalg.forward_mode import tangent_source

__all__ = ["entry_functions", "check_homogeneous"]


class _StoreAtOffset(ast.NodeTransformer):
    """``return (v0, ...)`` -> ``out[ob + e] = v_e`` (then, for a tangent form, ``dout[db + e] =
    the e-th tangent``)."""

    def __init__(self, name, m, extra_args, tangent: bool):
        self.name, self.m, self.extra, self.tangent = name, m, extra_args, tangent

    def visit_FunctionDef(self, node):
        node.name = self.name
        node.args.args += [ast.arg(arg=a) for a in self.extra]
        node.body = [st for st in node.body
                     if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
        self.generic_visit(node)
        return node

    def visit_Return(self, node):
        elts = node.value.elts
        want = 2 * self.m if self.tangent else self.m
        if len(elts) != want:
            raise ValueError(f"declared Jacobian source: expected {want} values, got {len(elts)}")

        def store(arr, base, e, v):
            target = ast.Subscript(value=ast.Name(arr, ast.Load()),
                                   slice=ast.BinOp(ast.Name(base, ast.Load()), ast.Add(),
                                                   ast.Constant(e)), ctx=ast.Store())
            return ast.Assign(targets=[target], value=v, lineno=0)

        out = [store("out", "ob", e, v) for e, v in enumerate(elts[:self.m])]
        if self.tangent:
            out += [store("dout", "db", e, v) for e, v in enumerate(elts[self.m:])]
        return out


def _one_function(source: str) -> ast.FunctionDef:
    fns = [f for f in ast.parse(source).body if isinstance(f, ast.FunctionDef)]
    if len(fns) != 1:
        raise ValueError("declared Jacobian source must define exactly one function")
    return fns[0]


def entry_functions(device_source: str, m: int) -> str:
    """Module text defining ``jac_entries`` and ``jac_dt_entries`` (module docstring)."""
    fn = _one_function(device_source)
    args = [a.arg for a in fn.args.args]
    if args != ["x", "p", "tv"]:
        raise ValueError(f"declared Jacobian core must take (x, p, tv), takes {args}")
    tsrc = tangent_source(device_source, fn.name, {"x": "1.0", "tv": ("array", "dtv")},
                          "jac_dt_entries")
    plain = ast.Module(body=[_StoreAtOffset("jac_entries", m, ("out", "ob"), False).visit(fn)],
                       type_ignores=[])
    tfn = _one_function(tsrc.source)
    dt = ast.Module(body=[_StoreAtOffset("jac_dt_entries", m, ("out", "ob", "dout", "db"),
                                         True).visit(tfn)], type_ignores=[])
    return (ast.unparse(ast.fix_missing_locations(plain)) + "\n\n\n"
            + ast.unparse(ast.fix_missing_locations(dt)) + "\n")


def check_homogeneous(rhs_core, n: int, P: int, n_tv: int) -> None:
    """The warp kernel computes f = J y, so the rhs (its table-free core, device flavour) must
    have no y-free term: f(0) = 0 at a random point."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = float(rng.uniform(-5.0, -1.0))
    p = tuple(float(v) for v in rng.uniform(0.5, 2.0, max(P, 1)))[:max(P, 1)]
    tv = tuple(float(v) for v in rng.uniform(-1.0, 1.0, n_tv))
    f0 = np.asarray(rhs_core(tuple(0.0 for _ in range(n)), x, p, tv), np.float64)
    if np.any(f0 != 0.0):
        raise ValueError("the rhs is affine, not linear, in y (f(0) != 0): the warp kernel "
                         "computes f = J y and cannot run it")
