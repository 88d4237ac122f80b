"""What a generated CUDA kernel depends on, and the pieces every generated module shares.

A :class:`KernelSpec` holds everything the kernel text depends on (sizes, the LU's source and slot
layout, the colouring, the tableau and controller as literals) and nothing it does not: tolerances,
weights and the arrays are kernel arguments, so one compiled kernel serves every tolerance.
``KERNEL_ARGS`` / ``SENS_KERNEL_ARGS`` are the kernels' positional arguments, in order; the numba
launch, the XLA FFI handler's argument layout and the CPU emulator all read them.

``lu_source_to_out_form`` rewrites the compiled sparse LU of :mod:`solver.linalg.sparse_lu`
(``LinearSolver.source``: tuple-returning ``lu_factor(a)`` / ``lu_solve(lu, b)``) by an AST pass so
the results land in an ``out`` array; the arithmetic is the generated SSA text verbatim.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

__all__ = ["KernelSpec", "build_spec", "check_spec", "lu_source_to_out_form", "lit",
           "entries_to_out_form",
           "MAX_DIRECTIONS", "KERNEL_ARGS", "SENS_KERNEL_ARGS"]

#: numba-enzyme-cuda accepts at most this many direction sets in one ``jvp`` call.
MAX_DIRECTIONS = 8

#: The kernel's positional arguments, in order (the backend and the emulator both use it).
KERNEL_ARGS = ("y0", "t0", "t_end", "t_save", "params", "args", "rtol", "atol", "weights", "h0",
               "n_weighted", "ys", "t_out", "status", "n_accepted", "n_rejected", "n_traj")

#: The sensitivity kernel's positional arguments (``codegen.sensitivity``).
SENS_KERNEL_ARGS = ("y0", "t0", "t_end", "t_save", "params", "args", "s0", "dparams", "dargs",
                    "rtol", "atol", "atol_s", "weights", "weights_s", "h0", "n_weighted", "ys",
                    "dys", "t_out", "status", "n_accepted", "n_rejected", "n_traj", "n_dir")


@dataclass(frozen=True)
class KernelSpec:
    """Everything the kernel text depends on (and nothing it does not: tolerances are arguments)."""

    n: int
    n_params: int            # P as the RHS sees it (>= 1: the backend pads P = 0 with a dummy)
    has_args: bool
    max_steps: int
    lu_source: str           # LinearSolver.source (straight-line lu_factor / lu_solve)
    nslots: int
    diag_slots: tuple
    colors: tuple            # colour of each column
    n_colors: int
    jac_slots: tuple         # ((slot, colour, row), ...) for every slot in the pattern
    tableau: object
    controller: object
    n_tv: int = 0            # > 0: args are tables read through a TableSplit (``cuda.tables``)
    #: the rhs's declared Jacobian (solver.linalg.direct) as ``jac_entries(t, p, tv, out)``
    #: writing straight into the LU slots; "" = colour sweeps (``colors``, ``jac_slots``)
    direct_source: str = ""
    direct_slots: tuple = ()  # the slot of each declared entry
    #: the stages 1..S-1 as one loop with a literal branch a stage (codegen.rodas
    #: ._emit_stages_rolled) instead of unrolled: it compiles ~30% faster, but solves 3-11% slower
    #: on an H200 (docs/benchmarks.md), and the compiled kernel is cached on disk, so the default
    #: is the unrolled form
    rolled_stages: bool = False


def lit(x) -> str:
    """Float literal that round-trips exactly."""
    x = float(x)
    if not np.isfinite(x):
        raise ValueError(f"non-finite literal {x}")
    return repr(x)


class _OutForm(ast.NodeTransformer):
    def visit_FunctionDef(self, node):
        node.args.args.append(ast.arg(arg="out"))
        self.generic_visit(node)
        return node

    def visit_Return(self, node):
        if not isinstance(node.value, ast.Tuple):
            raise ValueError("generated LU source: expected 'return (tuple)'")
        stmts = [ast.Assign(targets=[ast.Subscript(value=ast.Name("out", ast.Load()),
                                                   slice=ast.Constant(i), ctx=ast.Store())],
                            value=elt, lineno=0)
                 for i, elt in enumerate(node.value.elts)]
        return stmts


def lu_source_to_out_form(source: str) -> str:
    """Rewrite ``lu_factor(a)``/``lu_solve(lu, b)`` (tuple-returning) to ``(…, out)`` array form."""
    tree = ast.parse(source)
    names = [f.name for f in tree.body if isinstance(f, ast.FunctionDef)]
    if sorted(names) != ["lu_factor", "lu_solve"]:
        raise ValueError(f"LU source must define lu_factor and lu_solve, got {names}")
    tree = ast.fix_missing_locations(_OutForm().visit(tree))
    return ast.unparse(tree) + "\n"


def check_spec(spec: KernelSpec) -> None:
    """What every generated kernel needs of its spec (plain and sensitivity kernels alike)."""
    if spec.n_params < 1:
        raise ValueError("n_params must be >= 1 (pad P = 0 with a dummy parameter)")
    if spec.has_args and spec.n_tv < 1:
        raise ValueError("args reach the kernel only as tables through a TableSplit (n_tv >= 1): "
                         "Enzyme's CUDA jvp cannot take an array argument")


class _EntriesOutForm(ast.NodeTransformer):
    """``def f(a, b): ... return (v0, v1, ...)`` -> ``def name(a, b, out): ... out[s_e] = v_e``."""

    def __init__(self, name, slots):
        self.name, self.slots = name, slots

    def visit_FunctionDef(self, node):
        node.name = self.name
        node.args.args.append(ast.arg(arg="out"))
        node.body = [st for st in node.body
                     if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
        self.generic_visit(node)
        return node

    def visit_Return(self, node):
        elts = node.value.elts if isinstance(node.value, ast.Tuple) else None
        if elts is None or len(elts) != len(self.slots):
            raise ValueError(f"declared Jacobian source: expected a tuple of {len(self.slots)} "
                             "entries")
        return [ast.Assign(targets=[ast.Subscript(value=ast.Name("out", ast.Load()),
                                                  slice=ast.Constant(int(s)), ctx=ast.Store())],
                           value=v, lineno=0) for s, v in zip(self.slots, elts)]


def entries_to_out_form(source: str, slots, name: str = "jac_entries") -> str:
    """The one function in ``source`` (returning a tuple of Jacobian entries) rewritten to store
    entry e in ``out[slots[e]]`` -- the declared Jacobian written straight into the LU slots."""
    tree = ast.parse(source)
    fns = [f for f in tree.body if isinstance(f, ast.FunctionDef)]
    if len(fns) != 1:
        raise ValueError("declared Jacobian source must define exactly one function")
    tree.body = [_EntriesOutForm(name, tuple(slots)).visit(fns[0])]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def build_spec(n, n_params, has_args, max_steps, linear, jac_plan, tableau, controller,
               n_tv: int = 0, direct=None) -> KernelSpec:
    """KernelSpec from a sparse :class:`LinearSolver` and either a :class:`JacobianPlan` on its
    slots or ``direct`` = (declared Jacobian device source, slot of each entry)."""
    if linear.source is None:
        raise ValueError("the CUDA kernel needs the straight-line sparse LU (LinearSolver.source)")
    if direct is not None:
        source, slots = direct
        return KernelSpec(n=n, n_params=n_params, has_args=has_args, max_steps=int(max_steps),
                          lu_source=linear.source, nslots=int(linear.nslots),
                          diag_slots=tuple(int(d) for d in linear.diag_slots), colors=(),
                          n_colors=0, jac_slots=(), tableau=tableau, controller=controller,
                          n_tv=int(n_tv), direct_source=entries_to_out_form(source, slots),
                          direct_slots=tuple(int(x) for x in slots))
    gi = np.asarray(jac_plan.gather_index)
    nc = jac_plan.n_colors
    slots = tuple((int(s), int(g // n), int(g % n)) for s, g in enumerate(gi) if g < nc * n)
    return KernelSpec(n=n, n_params=n_params, has_args=has_args, max_steps=int(max_steps),
                      lu_source=linear.source, nslots=int(linear.nslots),
                      diag_slots=tuple(int(d) for d in linear.diag_slots),
                      colors=tuple(int(c) for c in jac_plan.colors), n_colors=int(nc),
                      jac_slots=slots, tableau=tableau, controller=controller, n_tv=int(n_tv))

