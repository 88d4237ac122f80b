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

First version: a plain numba launch on device arrays (no XLA FFI custom call yet), stiff problems
without ``args``.  Enzyme's CUDA ``jvp`` accepts only scalar/tuple inputs, so the table ``args`` of
the EB model need the interpolated table values passed to the RHS as scalars (see the report in
issue 4); the kernel already threads an ``args`` device array through to ``f_eval``/``jac_eval``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .controller import PIDController
from .status import Status
from .tableau import RODAS5P

__all__ = ["solve", "solve_emulated", "CudaBackendUnavailable", "build_plan", "THREADS_PER_BLOCK"]

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
        if sparsity is None:
            from .sparsity import detect_sparsity
            pattern = detect_sparsity(rhs, n, n_params, args=args_example) if has_args else \
                detect_sparsity(rhs, n, n_params)
        else:
            from .sparsity import validate_pattern
            pattern = validate_pattern(np.asarray(sparsity), n)
        pattern = np.asarray(pattern, bool) | np.eye(n, dtype=bool)
        self.pattern = pattern
        # the kernel always runs the compiled straight-line sparse LU (no pivoting; DESIGN §6)
        self.linear = build_linear_solver(pattern, method="sparse")
        if self.linear.source is None:
            raise NotImplementedError(
                f"pattern too large for the straight-line LU ({self.linear.method}); the CUDA "
                "kernel has no table-driven LU yet")
        self.jac_plan = build_jacobian_plan(pattern, self.linear)
        self.spec = build_spec(n, max(n_params, 1), has_args, max_steps, self.linear,
                               self.jac_plan, tab, ctrl)
        self.source = generate_kernel_source(self.spec)
        self.host_setup_s = time.perf_counter() - t_start
        self._kernel = None
        self.compile_s = None
        self.module_path = None

    # -- module file: real file so inspect.getsource / numba's AST front end can read it
    def _module(self, tag: str):
        digest = hashlib.sha1(self.source.encode()).hexdigest()[:16]
        root = Path(os.environ.get("BOLTZMANN_CUDA_CACHE",
                                    Path(tempfile.gettempdir()) / "boltzmann_cuda_kernels"))
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"rodas_kernel_{digest}.py"
        if not path.exists() or path.read_text() != self.source:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(self.source)
            os.replace(tmp, path)
        name = f"_rodas_kernel_{tag}_{digest}_{id(self)}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        self.module_path = str(path)
        return mod

    def kernel(self):
        """The numba-cuda-mlir kernel (compiled at the first launch; compile time in info)."""
        if self._kernel is not None:
            return self._kernel
        cuda, types, jvp = _cuda_modules()
        mod = self._module("gpu")
        rhs_dev = cuda.jit(device=True)(self.rhs)
        f64 = types.float64
        n, P = self.n, self.spec.n_params
        if self.has_args:
            raise NotImplementedError(
                "backend='cuda' with args (tables) is not implemented yet: numba-enzyme-cuda's "
                "CUDA jvp takes only scalars and tuples, so table values must enter the RHS as "
                "scalars (see solver/cuda_backend.py docstring)")
        sig = types.UniTuple(f64, n)(types.UniTuple(f64, n), f64, types.UniTuple(f64, P))
        mod.cuda = cuda
        mod.F64 = f64
        mod.rhs = rhs_dev
        mod.jvp_rhs = jvp(rhs_dev, signature=sig)
        for name in ("_nmax", "_nmin", "_isfin", "wrms", "f_eval", "jac_eval", "lu_factor",
                     "lu_solve"):
            setattr(mod, name, cuda.jit(device=True)(getattr(mod, name)))
        self._kernel = cuda.jit(mod.kernel)
        self._jac_kernel = cuda.jit(mod.jac_kernel)
        self._cuda = cuda
        return self._kernel

    def jacobian(self, y, t, params):
        """(f, J in slot layout, df/dt) at points (N, n), (N,), (N, P) through the GPU's device
        functions (the Enzyme colour sweeps): for tests against jax.jacfwd."""
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
        self._jac_kernel[blocks, THREADS_PER_BLOCK](
            cuda.to_device(y), cuda.to_device(t), cuda.to_device(np.ascontiguousarray(params)),
            cuda.to_device(np.zeros(1)), f, jv, dfdt, np.int64(N))
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
    _cuda_modules()  # fail early, with the reason, before any host-side work
    plan = build_plan(rhs, inp["n"], inp["P"], args=args, sparsity=sparsity,
                      max_steps=max_steps, controller=controller, tableau=tableau)
    kernel = plan.kernel()
    cuda = plan._cuda
    N, n, m = inp["N"], inp["n"], inp["t_save"].shape[1]
    d = {k: cuda.to_device(inp[k]) for k in ("y0", "t0", "t_end", "t_save", "params", "atol",
                                             "weights", "h0")}
    args_d = cuda.to_device(np.zeros(1)) if args is None else cuda.to_device(np.asarray(args))
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
            "kernel_module": plan.module_path}
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


def _emulated_jvp(rhs, n, P):
    import jax
    import jax.numpy as jnp

    def f(y, t, p):
        return jnp.stack([jnp.asarray(v, jnp.float64) for v in rhs(y, t, p)])

    @jax.jit
    def sweeps(y, t, p, dys, dts, dps):
        return jax.vmap(lambda dy, dt, dp: jax.jvp(f, (y, t, p), (dy, dt, dp))[1])(dys, dts, dps)

    def jvp_rhs(tg, y, t, p, *dirs):
        k = len(dirs) // 3
        dys = np.stack([np.asarray(dirs[3 * j]) for j in range(k)])
        dts = np.array([float(dirs[3 * j + 1]) for j in range(k)])
        dps = np.stack([np.asarray(dirs[3 * j + 2]) for j in range(k)])
        out = np.asarray(sweeps(np.asarray(y), float(t), np.asarray(p)[:P], dys, dts,
                                dps[:, :P]))
        if tg.ndim == 1:
            tg[:] = out[0]
        else:
            tg[:, :] = out

    return jvp_rhs


def solve_emulated(rhs, y0, t_save, params, *, args=None, rtol=1e-6, atol=1e-9, t0=None,
                   t_end=None, sparsity=None, error_weights=None, max_steps=100_000,
                   first_step=None, controller=None, tableau=RODAS5P):
    """Run the generated CUDA kernel text on the CPU, one trajectory after another.

    numpy arrays stand in for local/device arrays, ``jax.jvp`` for the Enzyme sweeps, the model's
    Python RHS for the device function.  Exactly the source the GPU compiles; for tests only.
    """
    if args is not None:
        raise NotImplementedError("solve_emulated: args not supported yet")
    inp = _prepare(y0, t_save, params, rtol, atol, t0, t_end, error_weights, max_steps,
                   first_step)
    plan = build_plan(rhs, inp["n"], inp["P"], sparsity=sparsity, max_steps=max_steps,
                      controller=controller, tableau=tableau)
    mod = plan._module("emu")
    emu = _EmuCuda()
    mod.cuda = emu
    mod.F64 = np.float64
    P = inp["P"]
    mod.rhs = (lambda y, t, p: rhs(y, t, p[:P])) if P else (lambda y, t, p: rhs(y, t, ()))
    mod.jvp_rhs = _emulated_jvp(rhs, inp["n"], P)
    N, n, m = inp["N"], inp["n"], inp["t_save"].shape[1]
    ys = np.full((N, m, n), -12345.0)
    t_out = np.zeros(N)
    st = np.full(N, -7, np.int32)
    nacc = np.zeros(N, np.int32)
    nrej = np.zeros(N, np.int32)
    for i in range(N):
        emu.thread = i
        mod.kernel(inp["y0"], inp["t0"], inp["t_end"], inp["t_save"], inp["params"], np.zeros(1),
                   inp["rtol"], inp["atol"], inp["weights"], inp["h0"], inp["n_weighted"], ys,
                   t_out, st, nacc, nrej, N)
    return _solution(ys, t_out, st, nacc, nrej, "cuda-emulated",
                     {"jacobian_colors": int(plan.jac_plan.n_colors)})
