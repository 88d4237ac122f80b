"""The CUDA backend of ``solver.solve`` (issue 4; DESIGN §7).

One trajectory per GPU thread, all per-trajectory state in thread-local arrays, 32 threads per
block, no barriers.  The kernel text comes from :mod:`solver.cuda_codegen`: the Rodas stage loop
unrolled with the shared tableau's literals, the PID controller, dense output and status codes with
the JAX backend's semantics; the Jacobian by numba-enzyme-cuda forward sweeps (one per colour group,
seeds as literals) straight into the slots of the compiled sparse LU, whose straight-line
factor/solve text is compiled as device functions.

numba-cuda-mlir and numba-enzyme-cuda are imported lazily (only when a CUDA solve is compiled), so
importing this module on a machine without them is harmless; using it raises
:class:`CudaBackendUnavailable` with the reason.

The same generated kernel text can also be run by :func:`solve_emulated` on a CPU, with numpy
arrays for the local arrays and ``jax.jvp`` for the Enzyme sweeps: slow, but it checks every line
of the kernel's logic where no GPU exists (tests/test_cuda_backend.py).

Tables (``args``): Enzyme's CUDA ``jvp`` accepts scalars and homogeneous tuples only, never an
array, so an RHS ``rhs(y, t, p, args)`` that reads tables must say how to keep the reads out of the
differentiated function.  It does so with the attribute ``rhs.table_split`` (protocol:
:class:`models.tables.TableSplit`, duck-typed here -- the solver knows nothing about what the
tables hold):

* ``n_tv``: number of table values; ``core_device(y, t, p, tv)``: the RHS given the tuple ``tv``
  (math-module scalars, literal indices; compiled as the device primal and differentiated);
* ``lookup_device(t, p, args)`` / ``lookup_dt_device(t, p, args)``: ``tv`` and d tv/dt from the
  args array (plain device functions, outside Enzyme, cell index clipped to the grid);
* ``core`` / ``lookup``: the JAX flavours of the same text (the CPU emulator's ``jax.jvp``);
* contract ``rhs(y, t, p, args) == core(y, t, p, lookup(t, p, args))`` (checked once per plan at
  the first trajectory's initial point) and tv independent of y.

The colour sweeps then hold tv fixed (seed 0) and the ∂f/∂t sweep seeds ``tv`` with d tv/dt: the
chain rule through the table.  ``args`` goes to the kernel as one C-contiguous float64 device
array (for the EB model: (n_cosmo, n_columns, 2, n_grid)); without args the kernel gets a (1,)
dummy.  ``args`` without ``rhs.table_split`` is a ``TypeError`` saying what is missing.  The JAX
backend ignores the split and keeps calling ``rhs(y, t, p, args)``.

Forward sensitivities (issue 5): :func:`solve_sensitivities` launches the generated
``sens_kernel`` (solver.cuda_codegen, "Sensitivity kernel"): N·m threads, one per (trajectory,
direction), each integrating [y, s_d] with the exact joint Jacobian (H u by Enzyme ``jvp(jvp)``);
:func:`sensitivity_emulated` runs the same text on the CPU with nested ``jax.jvp``;
``solver.sensitivity.solve_diff(backend="cuda")`` calls it for its tangent.

Launch: by default through the XLA FFI custom call of :mod:`solver.cuda_ffi` (the same cubin,
launched on XLA's stream; ``$BOLTZMANN_CUDA_LAUNCH``, see ``LAUNCH_MODES``), else numba-cuda-mlir's
own launch on device arrays (``_solve_numba``; also what the sensitivity kernel uses, from a
``jax.pure_callback``).  Not done yet: a table-driven LU for patterns too large for straight-line
code.

Register / local-memory budget (the EB model, lcdm.yaml defaults: n = 217 with the massive
neutrino at n_q = 5, l_max_ncdm = 24; 986 LU slots; 22 colours + 1 time sweep = 3 jvp calls of
<= 8 directions): per thread the kernel's local arrays are 14 n (y, y1, yi, fi, f0, dfdt, 8 stage
vectors) + 3 nslots (jv, w, lu) doubles = 47 KB, plus the jvp tangents (8 n per call, 42 KB over
the three calls unless the compiler reuses them) and the literal seed vectors (22 n, 38 KB,
constant-folded only if nvJitLink inlines the derivative as numba-enzyme-cuda intends).  That is
under CUDA's 512 KiB local-memory limit per thread but far beyond the 255 registers, so the state
lives in (L1/L2-cached) local memory; measured on the device: ``info["local_mem_per_thread"]``.
numba-cuda-mlir 0.5.4 sets no size limit of its own on ``cuda.local.array`` (a static-shape
``memref.alloca``; lowering/cuda.py); its ``max_registers`` jit option is the register cap
(not used yet).  The driver reserves local memory for every thread that could be resident
(bytes/thread × 2048 × 132 SMs on an H200: ~35 GB at 130 KB), on top of what JAX preallocates
(75% of the GPU by default) -- run JAX and this backend side by side with
XLA_PYTHON_CLIENT_PREALLOCATE=false (or a lower XLA_PYTHON_CLIENT_MEM_FRACTION) if a launch fails
for memory.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from .controller import PIDController
from .cuda_codegen import MAX_DIRECTIONS
from .status import Status
from .tableau import RODAS5P

__all__ = ["solve", "solve_emulated", "jacobian_emulated", "CudaBackendUnavailable", "build_plan",
           "table_split_of", "THREADS_PER_BLOCK", "solve_sensitivities", "sensitivity_emulated",
           "build_sens_plan", "SensitivitySolution", "sens_probe_emulated"]

THREADS_PER_BLOCK = 32


class CudaBackendUnavailable(RuntimeError):
    """The CUDA backend cannot run here (no GPU, or numba-cuda-mlir / numba-enzyme-cuda missing)."""


def _cuda_modules():
    """(numba_cuda_mlir.cuda, numba_cuda_mlir.types, numba_enzyme.jvp), imported on first use."""
    try:
        from numba_cuda_mlir import cuda, types
    except Exception as exc:  # ImportError, or a CUDA/driver error raised at import
        raise CudaBackendUnavailable(
            "backend='cuda' needs numba-cuda-mlir (>=0.5.1,<0.6) and a CUDA GPU: "
            f"importing numba_cuda_mlir failed: {type(exc).__name__}: {exc}") from exc
    try:
        from numba_enzyme import jvp
    except Exception as exc:
        raise CudaBackendUnavailable(
            "backend='cuda' needs numba-enzyme-cuda 0.2.x (Linux x86_64, glibc >= 2.39) for the "
            f"Jacobian sweeps: importing numba_enzyme failed: {type(exc).__name__}: {exc}") from exc
    return cuda, types, jvp


# --------------------------------------------------------------------------- host-side validation
def _prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps, first_step):
    """Validate and normalise the inputs exactly as ``solver.api.solve`` does for the JAX backend."""
    from .api import validate_inputs

    y0, params, ts, t0a, tea, atol_a, w, h0 = validate_inputs(
        y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps, first_step)
    N, n = y0.shape
    if params.shape[1] == 0:  # the kernel passes p as a tuple of length >= 1
        params_k = np.zeros((N, 1))
    else:
        params_k = params
    return dict(y0=np.ascontiguousarray(y0), t0=np.ascontiguousarray(t0a, dtype=np.float64),
                t_end=np.ascontiguousarray(tea, dtype=np.float64),
                t_save=np.ascontiguousarray(ts), params=np.ascontiguousarray(params_k),
                rtol=float(rtol), atol=atol_a, weights=np.ascontiguousarray(w),
                h0=np.ascontiguousarray(h0, dtype=np.float64),
                n_weighted=float(max(int(np.sum(w > 0)), 1)), N=N, n=n, P=params.shape[1])


_SPLIT_ATTRS = ("n_tv", "core", "lookup", "core_device", "lookup_device", "lookup_dt_device")


def table_split_of(rhs, args):
    """``rhs.table_split`` when ``args`` is given (checked), None without args.

    Raises TypeError when ``args`` is given and the RHS lacks the protocol (what it must provide is
    in the message), or when ``args`` is not one numeric array.
    """
    if args is None:
        return None
    split = getattr(rhs, "table_split", None)
    missing = [a for a in _SPLIT_ATTRS if not hasattr(split, a)] if split is not None else None
    if split is None or missing:
        what = "has no attribute 'table_split'" if split is None else \
            f"has a table_split lacking {missing}"
        raise TypeError(
            f"backend='cuda' with args: the rhs {getattr(rhs, '__name__', rhs)!r} {what}. "
            "Enzyme's CUDA jvp cannot take an array, so an RHS that reads tables must provide "
            "rhs.table_split (models.tables.TableSplit): n_tv; core_device(y, t, p, tv) -> tuple "
            "of n (the RHS given the n_tv interpolated table values tv as a tuple of scalars); "
            "lookup_device(t, p, args) -> tv and lookup_dt_device(t, p, args) -> d tv/dt (plain "
            "device functions); core / lookup, their JAX flavours; with rhs(y, t, p, args) == "
            "core(y, t, p, lookup(t, p, args)). Use backend='jax' for other RHS with args.")
    a = np.asarray(args)
    if a.dtype == object or not np.issubdtype(a.dtype, np.number) or a.ndim == 0:
        raise TypeError("backend='cuda': args must be one numeric array (the tables), got "
                        f"{type(args).__name__}")
    return split


def _args_array(args):
    return np.ascontiguousarray(np.asarray(args, dtype=np.float64))


def _check_split(rhs, split, y, t, p, args):
    """The split must reproduce the rhs (one point; a wrong split would silently change the
    physics on the GPU).  Compares the device flavour with the JAX rhs."""
    import jax.numpy as jnp

    P = int(p.shape[0])
    ref = np.array([float(v) for v in rhs(jnp.asarray(y), jnp.asarray(t), jnp.asarray(p),
                                          jnp.asarray(args))])
    a = _args_array(args)
    pt = np.ascontiguousarray(p, dtype=np.float64)
    got = np.array(split.core_device(tuple(float(v) for v in y), float(t),
                                     tuple(float(v) for v in p[:P]),
                                     split.lookup_device(float(t), pt, a)), dtype=np.float64)
    scale = max(float(np.abs(ref).max()), 1e-300)
    if got.shape != ref.shape or not np.all(np.abs(got - ref) <= 1e-10 * scale):
        bad = np.argmax(np.abs(got - ref)) if got.shape == ref.shape else None
        raise ValueError(f"rhs.table_split does not reproduce rhs at t = {t}: component {bad} "
                         f"differs ({got.shape} vs {ref.shape} values)")


def _load_module(source: str, stem: str, tag: str, owner: int):
    """Import generated kernel text from a real file (``$BOLTZMANN_CUDA_CACHE`` or the temp dir,
    named by its hash): numba's front end and tracebacks read the source through linecache.
    Returns (module, path)."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    root = Path(os.environ.get("BOLTZMANN_CUDA_CACHE",
                                Path(tempfile.gettempdir()) / "boltzmann_cuda_kernels"))
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{stem}_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    name = f"_{stem}_{tag}_{digest}_{owner}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod, str(path)


def device_functions(plan) -> dict:
    """The Python functions compiled into a kernel besides ``plan.source``, by the module global
    each becomes: ``rhs`` (the differentiated primal: the table split's core, or the rhs itself)
    and, with tables, the lookups ``table_values`` / ``table_values_dt``.  ``_bind_gpu`` compiles
    exactly these, and ``solver.cuda_ffi`` fingerprints them for its kernel-image cache key."""
    split = getattr(plan, "split", None)
    if split is not None:
        return {"rhs": split.core_device, "table_values": split.lookup_device,
                "table_values_dt": split.lookup_dt_device}
    return {"rhs": plan.rhs}


def _bind_gpu(mod, plan, second_order: bool = False):
    """Inject the numba-cuda-mlir / numba-enzyme-cuda globals a generated module expects (see
    solver.cuda_codegen): ``cuda``, ``F64``, the device primal ``rhs`` (the table-free core with
    tables), its Enzyme ``jvp_rhs``, with ``second_order`` also ``jvp2_rhs`` = jvp(jvp_rhs) (the
    second-order sweep of the sensitivity kernel), and the table lookups.
    Returns the ``cuda`` module."""
    cuda, types, jvp = _cuda_modules()
    f64 = types.float64
    n, P = plan.n, plan.spec.n_params
    fns = device_functions(plan)
    rhs_dev = cuda.jit(device=True)(fns["rhs"])
    if plan.split is not None:
        # the differentiated primal is the table-free core; the lookups stay plain device
        # functions reading the args array (outside Enzyme)
        T = int(plan.split.n_tv)
        sig = types.UniTuple(f64, n)(types.UniTuple(f64, n), f64, types.UniTuple(f64, P),
                                     types.UniTuple(f64, T))
        mod.table_values = cuda.jit(device=True)(fns["table_values"])
        mod.table_values_dt = cuda.jit(device=True)(fns["table_values_dt"])
    else:
        sig = types.UniTuple(f64, n)(types.UniTuple(f64, n), f64, types.UniTuple(f64, P))
    mod.cuda = cuda
    mod.F64 = f64
    mod.rhs = rhs_dev
    mod.jvp_rhs = jvp(rhs_dev, signature=sig)
    if second_order:
        mod.jvp2_rhs = jvp(mod.jvp_rhs, signature=sig)
    return cuda


# --------------------------------------------------------------------------- the per-RHS plan
class _Plan:
    """Structure, LU, colouring, kernel source and (lazily) the compiled kernel for one RHS."""

    def __init__(self, rhs, n, n_params, has_args, args_example, sparsity, tab, ctrl,
                 max_steps):
        from .cuda_codegen import build_spec, generate_kernel_source
        from .jacobian import build_jacobian_plan
        from .linear import build_linear_solver

        t_start = time.perf_counter()
        self.rhs, self.n, self.n_params, self.has_args = rhs, n, n_params, has_args
        self.split = table_split_of(rhs, args_example) if has_args else None
        self.split_checked = False
        from .sparsity import solver_pattern
        self.pattern = pattern = solver_pattern(rhs, n, n_params, sparsity,
                                                args_example if has_args else None)
        # the kernel always runs the compiled straight-line sparse LU (no pivoting; DESIGN §6)
        self.linear = build_linear_solver(pattern, method="sparse")
        if self.linear.source is None:
            raise NotImplementedError(
                f"pattern too large for the straight-line LU ({self.linear.method}); the CUDA "
                "kernel has no table-driven LU yet")
        self.jac_plan = build_jacobian_plan(pattern, self.linear)
        self.spec = build_spec(n, max(n_params, 1), has_args, max_steps, self.linear,
                               self.jac_plan, tab, ctrl,
                               n_tv=int(self.split.n_tv) if self.split is not None else 0)
        self.source = generate_kernel_source(self.spec)
        self.host_setup_s = time.perf_counter() - t_start
        self._kernel = None
        self.compile_s = None
        self.module_path = None

    # -- module file: real file so inspect.getsource / numba's AST front end can read it
    def _module(self, tag: str):
        mod, self.module_path = _load_module(self.source, "rodas_kernel", tag, id(self))
        return mod

    def kernel(self):
        """The numba-cuda-mlir kernel (compiled at the first launch; compile time in info)."""
        if self._kernel is not None:
            return self._kernel
        mod = self._module("gpu")
        cuda = _bind_gpu(mod, self)
        for name in ("_nmax", "_nmin", "_isfin", "wrms", "f_eval", "jac_eval", "lu_factor",
                     "lu_solve"):
            setattr(mod, name, cuda.jit(device=True)(getattr(mod, name)))
        self._kernel = cuda.jit(mod.kernel)
        self._jac_kernel = cuda.jit(mod.jac_kernel)
        self._cuda = cuda
        return self._kernel

    def jacobian(self, y, t, params, args=None):
        """(f, J in slot layout, df/dt) at points (N, n), (N,), (N, P) through the GPU's device
        functions (the Enzyme colour sweeps; with tables df/dt includes the chain rule through
        them): for tests against jax.jacfwd.  ``args``: the tables, if the plan has them."""
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
        args_h = np.zeros(1) if args is None else _args_array(args)
        self._jac_kernel[blocks, THREADS_PER_BLOCK](
            cuda.to_device(y), cuda.to_device(t), cuda.to_device(np.ascontiguousarray(params)),
            cuda.to_device(args_h), f, jv, dfdt, np.int64(N))
        cuda.synchronize()
        return f.copy_to_host(), jv.copy_to_host(), dfdt.copy_to_host()


_PLANS: dict = {}


def build_plan(rhs, n, n_params, *, args=None, sparsity=None, max_steps=100_000,
               controller=None, tableau=RODAS5P) -> _Plan:
    """The cached plan (structure, LU, colours, kernel source) for one RHS and set of options."""
    ctrl = controller or PIDController()
    key = (rhs, n, n_params, args is not None,
           None if sparsity is None else np.asarray(sparsity, bool).tobytes(), tableau.name,
           ctrl, int(max_steps))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _Plan(rhs, n, n_params, args is not None, args, sparsity, tableau, ctrl,
                     int(max_steps))
        _PLANS[key] = plan
    return plan


def _check_plan_split(plan, rhs, inp, args):
    if plan.split is not None and not plan.split_checked:
        _check_split(rhs, plan.split, inp["y0"][0], inp["t0"][0], inp["params"][0, :inp["P"]],
                     args)
        plan.split_checked = True


def _kernel_attr(kernel, getter):
    """A compiled-kernel attribute, e.g. ``get_local_mem_per_thread`` (bytes) or
    ``get_regs_per_thread`` (max over compiled overloads; None if numba cannot say)."""
    try:
        v = getattr(kernel, getter)()
        return int(max(v.values())) if isinstance(v, dict) else int(v)
    except Exception:  # noqa: BLE001 - diagnostics only
        return None


def _solution(ys, t, status, nacc, nrej, backend, info):
    from .api import Solution

    return Solution(ys=ys, status=np.asarray(status, dtype=np.int32), t_final=t,
                    n_accepted=np.asarray(nacc), n_rejected=np.asarray(nrej), backend=backend,
                    info=info)


def solve(rhs, y0, t_save, params, *, args=None, rtol=1e-6, atol=1e-9, t0=None, t_end=None,
          sparsity=None, error_weights=None, max_steps=100_000, first_step=None,
          linear_solver="auto", controller=None, tableau=RODAS5P):
    """``solver.solve(..., backend="cuda")``: same contract and result as the JAX backend.

    ``linear_solver`` is accepted for API compatibility; the kernel always uses the compiled
    unpivoted sparse LU (for a dense pattern that is a dense unpivoted LU).
    """
    if linear_solver not in ("auto", "dense", "sparse"):
        raise ValueError(f"linear_solver must be one of ('auto', 'dense', 'sparse'), got "
                         f"{linear_solver!r}")
    inp = _prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                   first_step)
    table_split_of(rhs, args)  # a clear TypeError for args without rhs.table_split
    _cuda_modules()  # fail early, with the reason, before any host-side work
    if _ffi_launch():
        # launch through the XLA FFI custom call (solver/cuda_ffi.py); results stay JAX arrays
        from . import cuda_ffi
        return cuda_ffi.solve(rhs, y0, t_save, params, args=args, rtol=rtol, atol=atol, t0=t0,
                              t_end=t_end, sparsity=sparsity, error_weights=error_weights,
                              max_steps=max_steps, first_step=first_step,
                              linear_solver=linear_solver, controller=controller, tableau=tableau)
    return _solve_numba(rhs, inp, args, sparsity, max_steps, controller, tableau)


#: ``$BOLTZMANN_CUDA_LAUNCH``: "auto" (default: the XLA FFI launch, else the numba launch with a
#: warning when the FFI handler cannot be built, e.g. no g++), "ffi" (FFI or a clear error),
#: "numba" (numba-cuda-mlir's own launch on device arrays).  Both run the same cubin; the FFI
#: launch keeps results on XLA's stream and folds jax.vmap into one launch (H200, 2026-11-30:
#: the EB pipeline's P(k) through both launches agree to 1e-12, tests/test_cuda_backend.py).
LAUNCH_MODES = ("auto", "ffi", "numba")


def _ffi_launch() -> bool:
    mode = os.environ.get("BOLTZMANN_CUDA_LAUNCH", "auto")
    if mode not in LAUNCH_MODES:
        raise ValueError(f"BOLTZMANN_CUDA_LAUNCH={mode!r}: expected one of {LAUNCH_MODES}")
    if mode == "numba":
        return False
    from . import cuda_ffi
    try:
        cuda_ffi.load_library()
    except cuda_ffi.FfiBuildError as exc:
        if mode == "ffi":
            raise
        warnings.warn(f"the XLA FFI launch is unavailable ({exc}); using numba-cuda-mlir's launch "
                      f"(set BOLTZMANN_CUDA_LAUNCH=numba to silence this)", RuntimeWarning,
                      stacklevel=3)
        return False
    return True


def _solve_numba(rhs, inp, args, sparsity, max_steps, controller, tableau):
    """The plain kernel through a numba launch, on validated inputs (``_prepare``)."""
    plan = build_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                      max_steps=max_steps, controller=controller, tableau=tableau)
    _check_plan_split(plan, rhs, inp, args)
    kernel = plan.kernel()
    cuda = plan._cuda
    N, n, m = inp["N"], inp["n"], inp["t_save"].shape[1]
    d = {k: cuda.to_device(inp[k]) for k in ("y0", "t0", "t_end", "t_save", "params", "atol",
                                             "weights", "h0")}
    args_d = cuda.to_device(np.zeros(1) if args is None else _args_array(args))
    ys = cuda.device_array((N, m, n), dtype=np.float64)
    t_out = cuda.device_array(N, dtype=np.float64)
    st = cuda.device_array(N, dtype=np.int32)
    nacc = cuda.device_array(N, dtype=np.int32)
    nrej = cuda.device_array(N, dtype=np.int32)
    blocks = (N + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    first = plan.compile_s is None
    t_launch = time.perf_counter()
    kernel[blocks, THREADS_PER_BLOCK](d["y0"], d["t0"], d["t_end"], d["t_save"], d["params"],
                                      args_d, inp["rtol"], d["atol"], d["weights"], d["h0"],
                                      inp["n_weighted"], ys, t_out, st, nacc, nrej, np.int64(N))
    cuda.synchronize()
    elapsed = time.perf_counter() - t_launch
    if first:
        plan.compile_s = elapsed  # compile + first run
    info = {"linear_solver": "sparse", "jacobian_colors": int(plan.jac_plan.n_colors),
            "lu_slots": int(plan.linear.nslots), "kernel_seconds": elapsed,
            "first_call_includes_compile": first, "host_setup_seconds": plan.host_setup_s,
            "kernel_module": plan.module_path, "table_values": plan.spec.n_tv, "launch": "numba",
            "local_mem_per_thread": _kernel_attr(kernel, "get_local_mem_per_thread"),
            "regs_per_thread": _kernel_attr(kernel, "get_regs_per_thread")}
    return _solution(ys.copy_to_host(), t_out.copy_to_host(), st.copy_to_host(),
                     nacc.copy_to_host(), nrej.copy_to_host(), "cuda", info)


# --------------------------------------------------------------------------- CPU emulation
class _Local:
    @staticmethod
    def array(shape, dtype):
        # NaN-filled: a read of an unwritten slot poisons the result (caught by the tests)
        return np.full(shape, np.nan)


class _EmuCuda:
    local = _Local()

    def __init__(self):
        self.thread = 0

    def grid(self, dim):
        return self.thread


def _emulated_jvp(f_jax, P, n_tv):
    """``jax.jvp`` in place of Enzyme's: same call layout (tangent out, the primal's arguments,
    then one direction set mirroring them per sweep)."""
    import jax
    import jax.numpy as jnp

    n_prim = 4 if n_tv else 3

    def f(*a):
        return jnp.stack([jnp.asarray(v, jnp.float64) for v in f_jax(*a)])

    @jax.jit
    def sweeps(prim, dirs):
        return jax.vmap(lambda *d: jax.jvp(f, prim, d)[1])(*dirs)

    prim_of = functools.partial(_emulated_group, P=P, n_tv=n_tv)

    def jvp_rhs(tg, *a):
        prim, dirs = a[:n_prim], a[n_prim:]
        k = len(dirs) // n_prim
        if len(dirs) != k * n_prim or not 1 <= k <= MAX_DIRECTIONS:
            raise TypeError(f"emulated jvp: {len(dirs)} direction arguments")
        sets = [prim_of(dirs[n_prim * d:n_prim * (d + 1)]) for d in range(k)]
        # padded to MAX_DIRECTIONS with zero directions: one compiled shape for every call
        sets += [[np.zeros_like(v) for v in sets[0]]] * (MAX_DIRECTIONS - k)
        stacked = tuple(np.stack([s_[j] for s_ in sets]) for j in range(n_prim))
        out = np.asarray(sweeps(tuple(prim_of(prim)), stacked))[:k]
        if tg.ndim == 1:
            tg[:] = out[0]
        else:
            tg[:, :] = out

    return jvp_rhs


def _emulated_group(a, P, n_tv):
    """One argument group (y, t, p[, tv]) of an Enzyme call as jax.jvp operands (copies: the
    kernel reuses its local arrays)."""
    out = [np.array(a[0], np.float64), np.float64(a[1]), np.array(a[2], np.float64)[:P]]
    if n_tv:
        out.append(np.array(a[3], np.float64))
    return out


def _emulated_jvp2(f_jax, P, n_tv):
    """Nested ``jax.jvp`` in place of Enzyme's ``jvp(jvp(f))``, with its call layout for one
    sweep: ``(out, x, d1, ox, od)`` -- four argument groups mirroring the primal's ``y, t, p[,
    tv]``: the inner jvp's primal x and direction d1, then the outer direction on both; the
    result is D²f[d1, ox] + Df[od] (numba_enzyme.cuda: ``_call_arities`` with depth 2)."""
    import jax
    import jax.numpy as jnp

    k = 4 if n_tv else 3

    def f(*a):
        return jnp.stack([jnp.asarray(v, jnp.float64) for v in f_jax(*a)])

    def level1(*xd):
        return jax.jvp(f, xd[:k], xd[k:])[1]

    @jax.jit
    def second(x, d1, ox, od):
        return jax.jvp(level1, tuple(x) + tuple(d1), tuple(ox) + tuple(od))[1]

    def jvp2_rhs(tg, *a):
        if len(a) != 4 * k:
            raise TypeError(f"emulated jvp(jvp): {len(a)} arguments, the kernel uses one sweep "
                            f"({4 * k})")
        groups = [_emulated_group(a[g * k:(g + 1) * k], P, n_tv) for g in range(4)]
        tg[:] = np.asarray(second(*[tuple(gr) for gr in groups]))

    return jvp2_rhs


def _emulation_module(plan, rhs, P, mod=None):
    """The plan's kernel module (or ``mod``, another generated module of the same plan, e.g. the
    sensitivity kernel's) with numpy/JAX stand-ins for cuda, Enzyme and the device RHS."""
    mod = plan._module("emu") if mod is None else mod
    emu = _EmuCuda()
    mod.cuda = emu
    mod.F64 = np.float64
    split = plan.split
    if split is not None:
        core = split.core_device
        mod.rhs = lambda y, t, p, tv: core(y, t, p[:P], tv)
        mod.table_values = split.lookup_device
        mod.table_values_dt = split.lookup_dt_device
        mod.jvp_rhs = _emulated_jvp(split.core, P, int(split.n_tv))
        mod.jvp2_rhs = _emulated_jvp2(split.core, P, int(split.n_tv))
    else:
        mod.rhs = (lambda y, t, p: rhs(y, t, p[:P])) if P else (lambda y, t, p: rhs(y, t, ()))
        mod.jvp_rhs = _emulated_jvp(rhs, P, 0)
        mod.jvp2_rhs = _emulated_jvp2(rhs, P, 0)
    return mod, emu


def solve_emulated(rhs, y0, t_save, params, *, args=None, rtol=1e-6, atol=1e-9, t0=None,
                   t_end=None, sparsity=None, error_weights=None, max_steps=100_000,
                   first_step=None, controller=None, tableau=RODAS5P):
    """Run the generated CUDA kernel text on the CPU, one trajectory after another.

    numpy arrays stand in for local/device arrays, ``jax.jvp`` for the Enzyme sweeps, the model's
    Python RHS for the device function.  Exactly the source the GPU compiles; for tests only.
    """
    inp = _prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                   first_step)
    table_split_of(rhs, args)
    return _emulate_plain(rhs, inp, args, sparsity, max_steps, controller, tableau)


def _emulate_plain(rhs, inp, args, sparsity, max_steps, controller, tableau):
    """:func:`_solve_numba`'s emulated twin (same arguments): the plain kernel text on the CPU."""
    plan = build_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                      max_steps=max_steps, controller=controller, tableau=tableau)
    _check_plan_split(plan, rhs, inp, args)
    mod, emu = _emulation_module(plan, rhs, inp["P"])
    args_h = np.zeros(1) if args is None else _args_array(args)
    N, n, m = inp["N"], inp["n"], inp["t_save"].shape[1]
    ys = np.full((N, m, n), -12345.0)
    t_out = np.zeros(N)
    st = np.full(N, -7, np.int32)
    nacc = np.zeros(N, np.int32)
    nrej = np.zeros(N, np.int32)
    for i in range(N):
        emu.thread = i
        mod.kernel(inp["y0"], inp["t0"], inp["t_end"], inp["t_save"], inp["params"], args_h,
                   inp["rtol"], inp["atol"], inp["weights"], inp["h0"], inp["n_weighted"], ys,
                   t_out, st, nacc, nrej, N)
    return _solution(ys, t_out, st, nacc, nrej, "cuda-emulated",
                     {"jacobian_colors": int(plan.jac_plan.n_colors),
                      "table_values": plan.spec.n_tv})


def jacobian_emulated(rhs, y, t, params, *, args=None, sparsity=None):
    """(f, J in slot layout, df/dt, plan) at points (N, n), (N,), (N, P) through the kernel text's
    ``jac_kernel`` on the CPU (as :meth:`_Plan.jacobian` does on the GPU): for tests."""
    y = np.ascontiguousarray(np.atleast_2d(np.asarray(y, np.float64)))
    N, n = y.shape
    t = np.ascontiguousarray(np.broadcast_to(np.asarray(t, np.float64), (N,)))
    params = np.asarray(params, np.float64).reshape(N, -1)
    P = params.shape[1]
    table_split_of(rhs, args)
    plan = build_plan(rhs, n, P, args=args, sparsity=sparsity)
    mod, emu = _emulation_module(plan, rhs, P)
    pk = np.ascontiguousarray(params if P else np.zeros((N, 1)))
    args_h = np.zeros(1) if args is None else _args_array(args)
    f = np.full((N, n), np.nan)
    jv = np.full((N, plan.linear.nslots), np.nan)
    dfdt = np.full((N, n), np.nan)
    for i in range(N):
        emu.thread = i
        mod.jac_kernel(y, t, pk, args_h, f, jv, dfdt, N)
    return f, jv, dfdt, plan


# --------------------------------------------------------------------------- forward sensitivities
class _SensPlan:
    """The forward-sensitivity kernel of one plain plan (same pattern, LU, colours and spec; the
    text from :func:`solver.cuda_codegen.generate_sens_kernel_source`), compiled lazily."""

    def __init__(self, plain: _Plan):
        from .cuda_codegen import generate_sens_kernel_source

        self.plain = plain
        self.source = generate_sens_kernel_source(plain.spec)
        self._kernel = None
        self.compile_s = None
        self.module_path = None
        self._lookup_p = None   # p columns the table lookup depends on (see _check_lookup_p)

    def _module(self, tag: str):
        mod, self.module_path = _load_module(self.source, "rodas_sens_kernel", tag, id(self))
        return mod

    def kernel(self):
        """The numba-cuda-mlir sensitivity kernel (compiled at the first launch)."""
        if self._kernel is not None:
            return self._kernel
        mod = self._module("gpu")
        cuda = _bind_gpu(mod, self.plain, second_order=True)
        for name in ("_nmax", "_nmin", "_isfin", "f_eval", "jac_eval", "lu_factor", "lu_solve",
                     "wsq", "wrms_joint", "tan_eval", "hess_eval", "tan_dt_eval"):
            setattr(mod, name, cuda.jit(device=True)(getattr(mod, name)))
        self._kernel = cuda.jit(mod.sens_kernel)
        self._probe_kernel = cuda.jit(mod.sens_probe_kernel)
        self._cuda = cuda
        return self._kernel

    def probe(self, y, s, u, t, params, dparams, args=None, dargs=None):
        """(s', H u, ∂s'/∂t) at points (N, n) through the GPU's device functions (Enzyme jvp and
        jvp(jvp)): for tests against nested jax.jvp.  dargs: (N or 1, *args.shape) or None."""
        self.kernel()
        cuda = self._cuda
        a = _probe_inputs(self, y, s, u, t, params, dparams, args, dargs)
        N = a[0].shape[0]
        outs = [cuda.device_array((N, self.plain.n), dtype=np.float64) for _ in range(3)]
        blocks = (N + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
        self._probe_kernel[blocks, THREADS_PER_BLOCK](*[cuda.to_device(x) for x in a], *outs,
                                                      np.int64(N))
        cuda.synchronize()
        return tuple(o.copy_to_host() for o in outs)


_SENS_PLANS: dict = {}


def build_sens_plan(rhs, n, n_params, *, args=None, sparsity=None, max_steps=100_000,
                    controller=None, tableau=RODAS5P) -> _SensPlan:
    """The cached sensitivity plan on top of :func:`build_plan`'s plain plan."""
    plain = build_plan(rhs, n, n_params, args=args, sparsity=sparsity, max_steps=max_steps,
                       controller=controller, tableau=tableau)
    plan = _SENS_PLANS.get(id(plain))
    if plan is None or plan.plain is not plain:
        plan = _SensPlan(plain)
        _SENS_PLANS[id(plain)] = plan
    return plan


class SensitivitySolution:
    """Result of :func:`solve_sensitivities` / :func:`sensitivity_emulated`.

    ys (N, ns, n): the states (from each trajectory's direction-0 thread); dys (m, N, ns, n): the
    sensitivities s_d at the save times; status, t_final, n_accepted, n_rejected: (m, N), one per
    thread (direction, trajectory); info: launch diagnostics.
    """

    def __init__(self, ys, dys, status, t_final, n_accepted, n_rejected, backend, info):
        self.ys, self.dys, self.status, self.t_final = ys, dys, status, t_final
        self.n_accepted, self.n_rejected = n_accepted, n_rejected
        self.backend, self.info = backend, info

    def trajectory_status(self) -> np.ndarray:
        """(N,): OK where every direction of the trajectory finished, else the first failed
        direction's status (a failed (i, d) fails trajectory i)."""
        st = np.asarray(self.status)
        bad = st != int(Status.OK)
        first = np.argmax(bad, axis=0)
        return np.where(bad.any(axis=0), st[first, np.arange(st.shape[1])], int(Status.OK))

    def dys_or_nan(self) -> np.ndarray:
        """dys with every direction NaN at the save times some direction of that trajectory did
        not reach (as the JAX backend's joint solve of all directions at once reports)."""
        dys = np.array(self.dys)
        missing = np.any(np.isnan(dys), axis=(0, 3))          # (N, ns)
        dys[:, missing] = np.nan
        return dys


def _sens_inputs(rhs, y0, t_save, params, s0, dparams, dargs, args, rtol, atol, sens_atol, sec,
                 t0, t_end, error_weights, max_steps, first_step):
    """Validated kernel inputs: the plain solve's (``_prepare``) plus the tangents.

    s0 (m, N, n), dparams (m, N, P), dargs (m, *args.shape): any may be None (zero), at least
    one gives m.  dparams is padded like params (P = 0 -> one dummy column); without a
    differentiated table the kernel gets ONE all-zero tangent table (not m copies)."""
    inp = _prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                   first_step)
    N, n, P = inp["N"], inp["n"], inp["P"]
    present = [np.asarray(x) for x in (s0, dparams, dargs) if x is not None]
    if not present:
        raise ValueError("sensitivities need at least one tangent (s0, dparams or dargs)")
    m = int(present[0].shape[0])
    if m < 1:
        raise ValueError("sensitivities need at least one direction")
    s0 = np.zeros((m, N, n)) if s0 is None else np.asarray(s0, np.float64)
    if s0.shape != (m, N, n):
        raise ValueError(f"s0 must have shape {(m, N, n)}, got {s0.shape}")
    Pk = inp["params"].shape[1]
    dp = np.zeros((m, N, Pk))
    if dparams is not None and P:
        dparams = np.asarray(dparams, np.float64)
        if dparams.shape != (m, N, P):
            raise ValueError(f"dparams must have shape {(m, N, P)}, got {dparams.shape}")
        dp[:, :, :P] = dparams
    if args is None:
        if dargs is not None:
            raise ValueError("dargs given without args")
        da = np.zeros((1, 1))
    else:
        a = _args_array(args)
        if dargs is None:
            da = np.zeros((1,) + a.shape)
        else:
            da = np.asarray(dargs, np.float64)
            if da.shape != (m,) + a.shape:
                raise ValueError(f"dargs must have shape {(m,) + a.shape}, got {da.shape}")
    if not (np.all(np.isfinite(s0)) and np.all(np.isfinite(dp)) and np.all(np.isfinite(da))):
        raise ValueError("tangents contain non-finite values")
    atol_s = inp["atol"] if sens_atol is None else np.ascontiguousarray(
        np.broadcast_to(np.asarray(sens_atol, np.float64), (n,)))
    if np.any(atol_s <= 0):
        raise ValueError("sensitivity_atol must be positive")
    inp.update(s0=np.ascontiguousarray(s0), dparams=np.ascontiguousarray(dp),
               dargs=np.ascontiguousarray(da), atol_s=np.ascontiguousarray(atol_s, np.float64),
               weights_s=np.ascontiguousarray(inp["weights"] if sec else np.zeros(n)), m=m)
    return inp


def _check_lookup_p(plan: _SensPlan, rhs, inp, args):
    """The kernel's tangent table values are lookup(t, p, dargs_d): exact because the Hermite
    lookup is linear in the table, but blind to the lookup's own dependence on p (for the EB
    model: the grid's x_min and dx, constants of the table).  Finds those p columns once per plan
    (jax.jacfwd of split.lookup at the first trajectory's start) and refuses a nonzero tangent
    there rather than returning a wrong derivative."""
    if plan.plain.split is None:
        return
    P = inp["P"]
    if plan._lookup_p is None:
        import jax
        import jax.numpy as jnp

        split = plan.plain.split
        tab = jnp.asarray(_args_array(args))
        t = float(inp["t0"][0])
        J = jax.jacfwd(lambda p: jnp.stack([jnp.asarray(v, jnp.float64)
                                            for v in split.lookup(t, p, tab)]))(
            jnp.asarray(inp["params"][0, :P]))
        plan._lookup_p = tuple(int(c) for c in np.nonzero(np.any(np.asarray(J) != 0, axis=0))[0])
    cols = list(plan._lookup_p)
    if cols and np.any(inp["dparams"][:, :, cols] != 0):
        raise NotImplementedError(
            f"backend='cuda' sensitivities: the table lookup depends on params columns {cols} "
            "(table geometry) and their tangent is nonzero; the CUDA kernel does not "
            "differentiate the lookup with respect to p. Use backend='jax'.")


def _sens_outputs(inp):
    N, n, m, ns = inp["N"], inp["n"], inp["m"], inp["t_save"].shape[1]
    return dict(ys=np.full((N, ns, n), -12345.0), dys=np.full((m, N, ns, n), -12345.0),
                t_out=np.zeros((m, N)), status=np.full((m, N), -7, np.int32),
                n_accepted=np.zeros((m, N), np.int32), n_rejected=np.zeros((m, N), np.int32))


def _sens_call_args(inp, args_h, out):
    """The kernel's positional arguments in the order of cuda_codegen.SENS_KERNEL_ARGS."""
    return (inp["y0"], inp["t0"], inp["t_end"], inp["t_save"], inp["params"], args_h, inp["s0"],
            inp["dparams"], inp["dargs"], inp["rtol"], inp["atol"], inp["atol_s"],
            inp["weights"], inp["weights_s"], inp["h0"], inp["n_weighted"], out["ys"],
            out["dys"], out["t_out"], out["status"], out["n_accepted"], out["n_rejected"],
            inp["N"], inp["m"])


_SENS_DOC_ARGS = """
    s0 (m, N, n), dparams (m, N, P), dargs (m, *args.shape): the m tangent directions (initial
    sensitivities, parameter tangents, tangent tables; None = zero, at least one given).
    sensitivity_error_control: True -> the error norm covers [y, s] (joint error² = RMS_y² +
    RMS_s², the JAX backend's convention for one direction); False -> s has zero weight and every
    thread takes exactly the plain solve's steps.  sensitivity_atol: atol of s (default atol).
    Other arguments as :func:`solve`.  Returns a :class:`SensitivitySolution`."""


def solve_sensitivities(rhs, y0, t_save, params, *, s0=None, dparams=None, dargs=None,
                        args=None, rtol=1e-6, atol=1e-9, sensitivity_atol=None,
                        sensitivity_error_control=True, t0=None, t_end=None, sparsity=None,
                        error_weights=None, max_steps=100_000, first_step=None, controller=None,
                        tableau=RODAS5P):
    """Forward sensitivities on the GPU: one thread per (trajectory, direction), N·m threads,
    thread g = i·m + d (a trajectory's directions share a warp: same tables row and parameters,
    and without sensitivity error control identical step sequences, so no divergence)."""
    table_split_of(rhs, args)
    inp = _sens_inputs(rhs, y0, t_save, params, s0, dparams, dargs, args, rtol, atol,
                       sensitivity_atol, sensitivity_error_control, t0, t_end, error_weights,
                       max_steps, first_step)
    _cuda_modules()
    plan = build_sens_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                           max_steps=max_steps, controller=controller, tableau=tableau)
    _check_plan_split(plan.plain, rhs, inp, args)
    _check_lookup_p(plan, rhs, inp, args)
    kernel = plan.kernel()
    cuda = plan._cuda
    args_h = np.zeros(1) if args is None else _args_array(args)
    host = _sens_outputs(inp)
    dev_in = _sens_call_args(inp, args_h, host)
    dev = [cuda.to_device(x) if isinstance(x, np.ndarray) else x for x in dev_in]
    dev[-2], dev[-1] = np.int64(inp["N"]), np.int64(inp["m"])
    threads = inp["N"] * inp["m"]
    blocks = (threads + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    first = plan.compile_s is None
    t_launch = time.perf_counter()
    kernel[blocks, THREADS_PER_BLOCK](*dev)
    cuda.synchronize()
    elapsed = time.perf_counter() - t_launch
    if first:
        plan.compile_s = elapsed
    names = ("ys", "dys", "t_out", "status", "n_accepted", "n_rejected")
    res = {k: dev[16 + j].copy_to_host() for j, k in enumerate(names)}
    info = {"kernel_seconds": elapsed, "first_call_includes_compile": first, "threads": threads,
            "directions": inp["m"], "kernel_module": plan.module_path,
            "local_mem_per_thread": _kernel_attr(kernel, "get_local_mem_per_thread"),
            "regs_per_thread": _kernel_attr(kernel, "get_regs_per_thread")}
    return SensitivitySolution(res["ys"], res["dys"], res["status"], res["t_out"],
                               res["n_accepted"], res["n_rejected"], "cuda", info)


def sensitivity_emulated(rhs, y0, t_save, params, *, s0=None, dparams=None, dargs=None,
                         args=None, rtol=1e-6, atol=1e-9, sensitivity_atol=None,
                         sensitivity_error_control=True, t0=None, t_end=None, sparsity=None,
                         error_weights=None, max_steps=100_000, first_step=None,
                         controller=None, tableau=RODAS5P):
    """:func:`solve_sensitivities` with the generated kernel text run on the CPU, thread after
    thread (numpy local arrays, jax.jvp / nested jax.jvp for Enzyme's jvp / jvp(jvp)).  Slow;
    for tests of the kernel's logic where no GPU exists."""
    table_split_of(rhs, args)
    inp = _sens_inputs(rhs, y0, t_save, params, s0, dparams, dargs, args, rtol, atol,
                       sensitivity_atol, sensitivity_error_control, t0, t_end, error_weights,
                       max_steps, first_step)
    plan = build_sens_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                           max_steps=max_steps, controller=controller, tableau=tableau)
    _check_plan_split(plan.plain, rhs, inp, args)
    _check_lookup_p(plan, rhs, inp, args)
    mod, emu = _emulation_module(plan.plain, rhs, inp["P"], plan._module("emu"))
    args_h = np.zeros(1) if args is None else _args_array(args)
    out = _sens_outputs(inp)
    call = _sens_call_args(inp, args_h, out)
    for g in range(inp["N"] * inp["m"]):
        emu.thread = g
        mod.sens_kernel(*call)
    return SensitivitySolution(out["ys"], out["dys"], out["status"], out["t_out"],
                               out["n_accepted"], out["n_rejected"], "cuda-emulated",
                               {"threads": inp["N"] * inp["m"], "directions": inp["m"],
                                "kernel_module": plan.module_path})


solve_sensitivities.__doc__ += _SENS_DOC_ARGS
sensitivity_emulated.__doc__ += _SENS_DOC_ARGS


def _probe_inputs(plan, y, s, u, t, params, dparams, args, dargs):
    """Host arrays of sens_probe_kernel's inputs (params/dparams padded like the kernel's)."""
    y = np.ascontiguousarray(np.atleast_2d(np.asarray(y, np.float64)))
    N = y.shape[0]
    s, u = (np.ascontiguousarray(np.reshape(np.asarray(v, np.float64), y.shape)) for v in (s, u))
    t = np.ascontiguousarray(np.broadcast_to(np.asarray(t, np.float64), (N,)))
    P = plan.plain.n_params
    pk, dpk = np.zeros((N, max(P, 1))), np.zeros((N, max(P, 1)))
    pk[:, :P] = np.asarray(params, np.float64).reshape(N, P)
    dpk[:, :P] = np.asarray(dparams, np.float64).reshape(N, P)
    if args is None:
        a, da = np.zeros(1), np.zeros((1, 1))
    else:
        a = _args_array(args)
        da = np.zeros((1,) + a.shape) if dargs is None else \
            np.ascontiguousarray(np.asarray(dargs, np.float64))
    return y, s, u, t, pk, dpk, a, da


def sens_probe_emulated(rhs, y, s, u, t, params, dparams, *, args=None, dargs=None,
                        sparsity=None):
    """(s', H u, ∂s'/∂t) of the sensitivity kernel's device functions at points (N, n), run on
    the CPU (as :meth:`_SensPlan.probe` on the GPU): for tests."""
    y = np.atleast_2d(np.asarray(y, np.float64))
    N, n = y.shape
    P = np.asarray(params).reshape(N, -1).shape[1]
    table_split_of(rhs, args)
    plan = build_sens_plan(rhs, n, P, args=args, sparsity=sparsity)
    mod, emu = _emulation_module(plan.plain, rhs, P, plan._module("emu"))
    a = _probe_inputs(plan, y, s, u, t, params, dparams, args, dargs)
    outs = [np.full((N, n), np.nan) for _ in range(3)]
    for i in range(N):
        emu.thread = i
        mod.sens_probe_kernel(*a, *outs, N)
    return tuple(outs)
