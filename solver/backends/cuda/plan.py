"""The CUDA backend's per-RHS plans: structure, LU, colouring and kernel text, compiled lazily.

A :class:`Plan` is built on the host once per (rhs, sizes, options): the Jacobian pattern, the
compiled straight-line sparse LU (the kernel always runs it: no pivoting), the colouring, the
:class:`KernelSpec` and the generated kernel text. The numba-cuda-mlir kernel is compiled on the
first launch (``kernel()``); a :class:`SensPlan` adds the forward-sensitivity kernel of the same
spec. Both are cached, and shared by every launch path (numba, XLA FFI, CPU emulation).

Per thread, the kernel's state lives in local arrays: 14 n (y, y1, yi, fi, f0, dfdt, 8 stage
vectors) + 3 nslots (jv, w, lu) doubles, plus the jvp tangents and literal seed vectors. For the
EB model that is far beyond the 255 registers, so it lives in (L1/L2-cached) local memory; the
driver reserves local memory for every thread that could be resident, on top of what JAX
preallocates, so run JAX and this backend side by side with XLA_PYTHON_CLIENT_PREALLOCATE=false
if a launch fails for memory. ``info["local_mem_per_thread"]`` reports what the compiler chose.
"""
from __future__ import annotations

import time

import numpy as np

from ...caches import Cache
from ...linalg.direct import build_direct_jacobian, declared_pattern, direct_jacobian_of
from ...linalg.jacobian import build_jacobian_plan
from ...linalg.linear import build_linear_solver
from ...linalg.sparsity import solver_pattern
from ...method.controller import PIDController
from ...method.tableau import RODAS5P
from .codegen import build_spec, generate_kernel_source, generate_sens_kernel_source
from .inputs import probe_inputs
from .modules import bind_gpu, load_module
from .tables import args_array, check_split, table_split_of
from .toolchain import THREADS_PER_BLOCK

__all__ = ["Plan", "SensPlan", "build_plan", "build_sens_plan", "check_plan_split"]

#: plans by (rhs, n, P, has_args, sparsity, tableau, controller, max_steps); each may hold a
#: compiled kernel (minutes to build), so the bound is generous
PLANS = Cache("cuda.plans", maxsize=32)
#: sensitivity plans by their plain plan
SENS_PLANS = Cache("cuda.sens_plans", maxsize=32)


def _jit_module(mod, plain_plan, second_order: bool, device_names, kernel_names):
    """(cuda, kernels): a generated module's helpers compiled as device functions and its
    ``kernel_names`` as kernels, with the RHS device functions of ``plain_plan`` bound in."""
    cuda = bind_gpu(mod, plain_plan, second_order=second_order)
    for name in device_names:
        setattr(mod, name, cuda.jit(device=True)(getattr(mod, name)))
    return cuda, tuple(cuda.jit(getattr(mod, name)) for name in kernel_names)


def _direct_names(spec) -> tuple:
    """The device function of a declared Jacobian, when the kernel text has one."""
    return ("jac_entries",) if spec.direct_source else ()


class Plan:
    """Structure, LU, colouring, kernel source and (lazily) the compiled kernel for one RHS."""

    def __init__(self, rhs, n, n_params, has_args, args_example, sparsity, tab, ctrl,
                 max_steps):
        t_start = time.perf_counter()
        self.rhs, self.n, self.n_params, self.has_args = rhs, n, n_params, has_args
        self.split = table_split_of(rhs, args_example) if has_args else None
        self.split_checked = False
        # a declared Jacobian (solver.linalg.direct) replaces the Enzyme colour sweeps; the
        # kernel needs its device flavour on the table-free core
        lj = direct_jacobian_of(rhs) if self.split is not None else None
        if lj is not None and not getattr(lj, "device_source", ""):
            lj = None
        if lj is not None and sparsity is None:
            sparsity = declared_pattern(lj, n)
        self.pattern = pattern = solver_pattern(rhs, n, n_params, sparsity,
                                                args_example if has_args else None)
        self.linear = build_linear_solver(pattern, method="sparse")
        if self.linear.source is None:
            raise NotImplementedError(
                f"pattern too large for the straight-line LU ({self.linear.method}); the CUDA "
                "kernel has no table-driven LU yet")
        n_tv = int(self.split.n_tv) if self.split is not None else 0
        if lj is not None:
            placed = build_direct_jacobian(lj, self.linear.slot_rows, self.linear.slot_cols)
            self.jac_plan = None
            self.spec = build_spec(n, max(n_params, 1), has_args, max_steps, self.linear, None,
                                   tab, ctrl, n_tv=n_tv,
                                   direct=(lj.device_source, placed.entry_slots))
        else:
            self.jac_plan = build_jacobian_plan(pattern, self.linear)
            self.spec = build_spec(n, max(n_params, 1), has_args, max_steps, self.linear,
                                   self.jac_plan, tab, ctrl, n_tv=n_tv)
        #: "direct" (the rhs's declared J, one Enzyme sweep in t) or "colored" (a sweep a colour)
        self.jacobian_kind = "direct" if lj is not None else "colored"
        self.jacobian_colors = 0 if lj is not None else int(self.jac_plan.n_colors)
        self.source = generate_kernel_source(self.spec)
        self.host_setup_s = time.perf_counter() - t_start
        self._kernel = None
        self.compile_s = None
        self.module_path = None

    def module(self, tag: str, directory=None):
        """The kernel text imported from a real file (``modules.load_module``)."""
        mod, self.module_path = load_module(self.source, "rodas_kernel", tag, id(self),
                                            directory)
        return mod

    def kernel(self, module_dir=None):
        """The numba-cuda-mlir kernel (compiled at the first launch; compile time in info)."""
        if self._kernel is None:
            self._cuda, (self._kernel, self._jac_kernel) = _jit_module(
                self.module("gpu", module_dir), self, False,
                ("_nmax", "_nmin", "_isfin", "wrms", "f_eval", "jac_eval", "lu_factor",
                 "lu_solve") + _direct_names(self.spec), ("kernel", "jac_kernel"))
        return self._kernel

    def jacobian(self, y, t, params, args=None):
        """(f, J in slot layout, df/dt) at points (N, n), (N,), (N, P) through the GPU's device
        functions (the declared Jacobian or the Enzyme colour sweeps; with tables df/dt includes
        the chain rule through them): for tests against jax.jacfwd.  ``args``: the tables, if the plan has them."""
        if (args is None) != (not self.has_args):
            raise ValueError("jacobian: give args exactly when the plan was built with args")
        self.kernel()
        cuda = self._cuda
        y = np.ascontiguousarray(np.atleast_2d(y), dtype=np.float64)
        N = y.shape[0]
        t = np.ascontiguousarray(np.broadcast_to(np.asarray(t, np.float64), (N,)))
        params = np.asarray(params, np.float64).reshape(N, -1)
        if params.shape[1] == 0:
            params = np.zeros((N, 1))
        f = cuda.device_array((N, self.n), dtype=np.float64)
        jv = cuda.device_array((N, self.linear.nslots), dtype=np.float64)
        dfdt = cuda.device_array((N, self.n), dtype=np.float64)
        blocks = (N + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
        args_h = np.zeros(1) if args is None else args_array(args)
        self._jac_kernel[blocks, THREADS_PER_BLOCK](
            cuda.to_device(y), cuda.to_device(t), cuda.to_device(np.ascontiguousarray(params)),
            cuda.to_device(args_h), f, jv, dfdt, np.int64(N))
        cuda.synchronize()
        return f.copy_to_host(), jv.copy_to_host(), dfdt.copy_to_host()


def build_plan(rhs, n, n_params, *, args=None, sparsity=None, max_steps=100_000,
               controller=None, tableau=RODAS5P) -> Plan:
    """The cached plan (structure, LU, colours, kernel source) for one RHS and set of options."""
    ctrl = controller or PIDController()
    key = (rhs, n, n_params, args is not None,
           None if sparsity is None else np.asarray(sparsity, bool).tobytes(), tableau.name,
           ctrl, int(max_steps))
    return PLANS.get_or_build(key, lambda: Plan(rhs, n, n_params, args is not None, args,
                                                sparsity, tableau, ctrl, int(max_steps)))


def check_plan_split(plan, rhs, inp, args):
    """Once per plan, at the first trajectory's initial point: the table split reproduces rhs."""
    if plan.split is not None and not plan.split_checked:
        check_split(rhs, plan.split, inp["y0"][0], inp["t0"][0], inp["params"][0, :inp["P"]],
                    args)
        plan.split_checked = True


class SensPlan:
    """The forward-sensitivity kernel of one plain plan (same pattern, LU, colours and spec; the
    text from :func:`~.codegen.generate_sens_kernel_source`), compiled lazily."""

    def __init__(self, plain: Plan):
        self.plain = plain
        self.source = generate_sens_kernel_source(plain.spec)
        self._kernel = None
        self.compile_s = None
        self.module_path = None
        self.lookup_p = None   # p columns the table lookup depends on (inputs.check_lookup_p)
        self.cubin = None      # (KernelImage, CubinFunction) once launched from a kernel cache

    def module(self, tag: str, directory=None):
        mod, self.module_path = load_module(self.source, "rodas_sens_kernel", tag, id(self),
                                            directory)
        return mod

    def kernel(self, module_dir=None):
        """The numba-cuda-mlir sensitivity kernel (compiled at the first launch)."""
        if self._kernel is None:
            self._cuda, (self._kernel, self._probe_kernel) = _jit_module(
                self.module("gpu", module_dir), self.plain, True,
                ("_nmax", "_nmin", "_isfin", "f_eval", "jac_eval", "lu_factor", "lu_solve",
                 "wsq", "wrms_joint", "tan_eval", "hess_eval", "tan_dt_eval")
                + _direct_names(self.plain.spec),
                ("sens_kernel", "sens_probe_kernel"))
        return self._kernel

    def probe(self, y, s, u, t, params, dparams, args=None, dargs=None):
        """(s', H u, ∂s'/∂t) at points (N, n) through the GPU's device functions (Enzyme jvp and
        jvp(jvp)): for tests against nested jax.jvp.  dargs: (N or 1, *args.shape) or None."""
        self.kernel()
        cuda = self._cuda
        a = probe_inputs(self, y, s, u, t, params, dparams, args, dargs)
        N = a[0].shape[0]
        outs = [cuda.device_array((N, self.plain.n), dtype=np.float64) for _ in range(3)]
        blocks = (N + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
        self._probe_kernel[blocks, THREADS_PER_BLOCK](*[cuda.to_device(x) for x in a], *outs,
                                                      np.int64(N))
        cuda.synchronize()
        return tuple(o.copy_to_host() for o in outs)


def build_sens_plan(rhs, n, n_params, *, args=None, sparsity=None, max_steps=100_000,
                    controller=None, tableau=RODAS5P) -> SensPlan:
    """The cached sensitivity plan on top of :func:`build_plan`'s plain plan."""
    plain = build_plan(rhs, n, n_params, args=args, sparsity=sparsity, max_steps=max_steps,
                       controller=controller, tableau=tableau)
    plan = SENS_PLANS.get(id(plain))
    if plan is None or plan.plain is not plain:
        plan = SensPlan(plain)
        SENS_PLANS.put(id(plain), plan)
    return plan
