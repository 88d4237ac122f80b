"""The warp kernel's plan: which right-hand sides get it, its tables, text and compiled kernel.

A right-hand side gets the warp kernel (``codegen.warp``: one trajectory per warp) when it reads
tables through a ``TableSplit`` and declares a linear Jacobian with a device flavour
(``rhs.linear_jacobian``), and is linear, not affine, in y -- the EB models.  Everything else (the
stiff test problems) keeps the thread kernel of :mod:`.plan`.

:class:`WarpPlan` builds, once per (rhs, sizes, options): the declared pattern's LU in an
elimination order of few levels (``ordering="depth"``), the lane tables (``warp_schedule``), the
entry functions (``codegen.warp_entries``) and the module text; the numba-cuda-mlir kernel is
compiled on first use.  It offers what the launch paths read of a plan (``source``, ``split``,
``linear``, ``spec``, ``kernel()``, ``jacobian_kind``), plus ``lanes``, ``threads_per_block`` and
``sched`` / ``sched_f`` (the uint32 and float64 tables, the kernel's last two arguments).  One
block is one warp: the schedule's offsets are then literals, and a block's shared memory is one
trajectory's.
"""
from __future__ import annotations

import time

import numpy as np

from ...caches import Cache
from ...linalg.direct import build_direct_jacobian, declared_pattern, direct_jacobian_of
from ...linalg.linear import build_linear_solver
from ...method.controller import PIDController
from ...method.tableau import RODAS5P
from ...linalg.entry_terms import expand_entries
from .codegen.warp import WarpSpec, generate_warp_source
from .codegen.warp_entries import check_homogeneous, monomial_functions
from .modules import load_module
from .inputs import direction_warps
from .tables import table_split_of
from .warp_schedule import build_warp_schedule

__all__ = ["WarpPlan", "WarpSensView", "warp_eligible", "build_warp_plan", "WARP_SIZE",
           "MAX_STATIC_SHARED"]

#: lanes of a trajectory on a GPU: one warp
WARP_SIZE = 32
#: static shared memory a block may declare without an opt-in
MAX_STATIC_SHARED = 48 * 1024
#: direction warps a sensitivity block holds at most: at 255 registers a lane, two blocks of
#: four warps fill an SM's register file as eight one-warp blocks did
MAX_DIR_WARPS = 4

WARP_PLANS = Cache("cuda.warp_plans", maxsize=32)


def warp_eligible(rhs, has_args: bool) -> bool:
    """Whether ``rhs`` can run in the warp kernel (module docstring); affine right-hand sides
    are refused later, by the plan, with a clear error."""
    if not has_args or getattr(rhs, "table_split", None) is None:
        return False
    lj = direct_jacobian_of(rhs)
    return lj is not None and bool(getattr(lj, "device_source", ""))


class WarpPlan:
    """Structure, lane tables, kernel text and (lazily) the compiled warp kernel of one rhs."""

    kind = "warp"
    jacobian_kind = "direct"
    jacobian_colors = 0

    def __init__(self, rhs, n, n_params, args_example, tab, ctrl, max_steps, lanes):
        t_start = time.perf_counter()
        self.rhs, self.n, self.n_params = rhs, n, n_params
        self.has_args = True
        self.split = table_split_of(rhs, args_example)
        self.split_checked = False
        lj = direct_jacobian_of(rhs)
        P = max(n_params, 1)
        check_homogeneous(self.split.core_device, n, P, int(self.split.n_tv))
        self.pattern = declared_pattern(lj, n)
        self.linear = build_linear_solver(self.pattern, method="sparse", ordering="depth")
        placed = build_direct_jacobian(lj, self.linear.slot_rows, self.linear.slot_cols)
        self.terms = expand_entries(lj.device_source)
        self.schedule = build_warp_schedule(self.linear, lj.rows, lj.cols, placed.entry_slots,
                                            self.terms, lanes)
        sizes = (n, self.linear.nslots, lanes, len(lj.rows), len(self.terms.monomials))
        fits = [k for k in range(1, MAX_DIR_WARPS + 1)
                if WarpSpec.sens_bytes(*sizes, k) <= MAX_STATIC_SHARED]
        if not fits:
            raise NotImplementedError(
                f"the warp kernel needs {WarpSpec.sens_bytes(*sizes, 1)} B of shared memory per "
                f"trajectory (n = {n}, {self.linear.nslots} LU slots), more than a block's "
                f"static {MAX_STATIC_SHARED} B")
        self.spec = WarpSpec(n=n, n_params=P, n_tv=int(self.split.n_tv), m=len(lj.rows),
                             n_mono=len(self.terms.monomials), max_steps=int(max_steps),
                             tableau=tab, controller=ctrl, schedule=self.schedule,
                             mono_source=monomial_functions(self.terms), dir_warps=max(fits))
        self.lanes = lanes
        self.threads_per_block = lanes
        self.sched = self.schedule.ints
        self.sched_f = self.schedule.reals
        self.source = generate_warp_source(self.spec)
        self.host_setup_s = time.perf_counter() - t_start
        self._kernel = None
        self._sens_kernel = None
        self.compile_s = None
        self.sens_compile_s = None
        self.module_path = None
        self._sens_view = None

    @property
    def plain(self):
        """The plan itself (the sensitivity launch paths read ``plan.plain``)."""
        return self

    @property
    def sens(self) -> "WarpSensView":
        """The sensitivity kernel of this plan (``WarpSensView``)."""
        if self._sens_view is None:
            self._sens_view = WarpSensView(self)
        return self._sens_view

    def module(self, tag: str, directory=None):
        mod, self.module_path = load_module(self.source, "warp_kernel", tag, id(self), directory)
        return mod

    def kernel(self, module_dir=None, entry: str = "kernel"):
        """The numba-cuda-mlir dispatcher of ``kernel`` or ``sens_kernel`` (compiled at the first
        launch)."""
        if self._kernel is None:
            from numba_cuda_mlir import cuda, types

            mod = self.module("gpu", module_dir)
            mod.cuda = cuda
            mod.F64 = types.float64
            mod.U64 = types.uint64
            mod.table_values = cuda.jit(device=True)(self.split.lookup_device)
            mod.table_values_dt = cuda.jit(device=True)(self.split.lookup_dt_device)
            for name in ("_nmax", "_nmin", "_isfin", "mono_eval", "mono_dt_eval", "mono_th_eval",
                         "mono_all_eval"):
                setattr(mod, name, cuda.jit(device=True)(getattr(mod, name)))
            self._cuda = cuda
            self._kernel = cuda.jit(mod.kernel)
            self._sens_kernel = cuda.jit(mod.sens_kernel)
            self._jac_kernel = cuda.jit(mod.jac_kernel)
        return self._sens_kernel if entry == "sens_kernel" else self._kernel

    def blocks(self, n_traj: int) -> int:
        return int(n_traj)

    def direction_warps(self, m: int, cap: int | None = None) -> int:
        """Direction warps per block of the sensitivity kernel for ``m`` directions: at most the
        text's ``dir_warps`` (its interleaved shared arrays hold no more), at most ``cap``."""
        most = self.spec.dir_warps if cap is None else min(self.spec.dir_warps, int(cap))
        return direction_warps(m, most)

    def jacobian(self, y, t, params, args):
        """(f, J in slot layout, df/dt) at points (N, n) through the warp device code on the GPU
        (tests against jax.jacfwd)."""
        self.kernel()
        cuda = self._cuda
        y = np.ascontiguousarray(np.atleast_2d(y), dtype=np.float64)
        N = y.shape[0]
        t = np.ascontiguousarray(np.broadcast_to(np.asarray(t, np.float64), (N,)))
        params = np.ascontiguousarray(np.asarray(params, np.float64).reshape(N, -1))
        f = cuda.device_array((N, self.n), dtype=np.float64)
        jv = cuda.device_array((N, self.linear.nslots), dtype=np.float64)
        dfdt = cuda.device_array((N, self.n), dtype=np.float64)
        from .tables import args_array
        self._jac_kernel[self.blocks(N), self.threads_per_block](
            cuda.to_device(y), cuda.to_device(t), cuda.to_device(params),
            cuda.to_device(args_array(args)), f, jv, dfdt, np.int64(N),
            cuda.to_device(self.sched), cuda.to_device(self.sched_f))
        cuda.synchronize()
        return f.copy_to_host(), jv.copy_to_host(), dfdt.copy_to_host()


class WarpSensView:
    """The sensitivity kernel of a :class:`WarpPlan`, seen as the sensitivity launch paths see a
    plan (``kernel()`` is ``sens_kernel``; source, structure and caches are the plan's)."""

    kind = "warp"

    def __init__(self, plan: WarpPlan):
        self.plain = plan
        self.source, self.split, self.spec, self.linear = (plan.source, plan.split, plan.spec,
                                                           plan.linear)
        self.lanes, self.threads_per_block = plan.lanes, plan.threads_per_block
        self.sched, self.sched_f = plan.sched, plan.sched_f
        self.compile_s = None
        self.lookup_p = None
        self.cubin = None

    @property
    def module_path(self):
        return self.plain.module_path

    def kernel(self, module_dir=None):
        return self.plain.kernel(module_dir, entry="sens_kernel")


def build_warp_plan(rhs, n, n_params, *, args, max_steps=100_000, controller=None,
                    tableau=RODAS5P, lanes: int = WARP_SIZE) -> WarpPlan:
    """The cached warp plan for one rhs and set of options (``lanes`` < 32: the emulator's)."""
    ctrl = controller or PIDController()
    key = (rhs, n, n_params, tableau.name, ctrl, int(max_steps), int(lanes))
    return WARP_PLANS.get_or_build(key, lambda: WarpPlan(rhs, n, n_params, args, tableau, ctrl,
                                                        int(max_steps), int(lanes)))
