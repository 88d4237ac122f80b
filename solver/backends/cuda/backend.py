"""The CUDA backend: kernels generated from the shared tableau, controller and compiled sparse LU --
one trajectory per warp for linear right-hand sides with tables (the EB models; the declared
Jacobian, ``codegen.warp``), one per thread with Enzyme Jacobians for every other rhs and for
forward sensitivities.

How a solve reaches the GPU is the backend's ``launch``:

* ``"auto"`` (default): the XLA FFI launch (``launch_ffi``), or numba-cuda-mlir's own launch
  with a warning when the FFI handler cannot be built (for example without g++);
* ``"ffi"``: the XLA FFI launch, or a clear error;
* ``"numba"``: numba-cuda-mlir's launch on device arrays (``launch_numba``);
* ``"emulated"``: the generated kernel text on the CPU (``emulation``; tests, no GPU needed).

Both GPU launches run the same cubin. Inside JAX programs (``solve_diff``, ``solve_with_tangents``)
the value is the FFI custom call where that launch is available, and the tangents run as
``sensitivity_launch`` says: ``"ffi"`` the sensitivity kernel's own XLA FFI custom call
(``launch_ffi_sens``: operands and tangents stay on the GPU), ``"host"`` a host callback
(``jax.pure_callback``: the sensitivity kernel, or the emulator, on copies of the operands),
``"auto"`` (default) the custom call wherever the plain solve uses the FFI launch, else the
callback; both work eagerly, under ``jit`` and under ``vmap`` (sequentially).
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np

from ..base import Backend
from .emulation import emulate_plain, sensitivity_emulated
from .ffi_library import FfiBuildError, FfiLibrary
from .inputs import kernel_inputs, prepare
from .kernel_cache import KernelCache
from .launch_ffi import FfiLauncher
from .launch_ffi_sens import sensitivities_jax
from .launch_numba import solve_numba, solve_sensitivities
from .modules import scratch_dir
from .results import keep_states
from .tables import check_args_structure, table_split_of
from .toolchain import check_cuda_packages, cuda_modules

__all__ = ["CudaBackend", "LAUNCH_MODES", "SENSITIVITY_LAUNCHES", "KERNEL_KINDS"]

LAUNCH_MODES = ("auto", "ffi", "numba", "emulated")
SENSITIVITY_LAUNCHES = ("auto", "host", "ffi")
KERNEL_KINDS = ("auto", "warp", "thread")
_LINEAR_SOLVERS = ("auto", "dense", "sparse")


class CudaBackend(Backend):
    """``backend="cuda"``, or an instance with its own settings.

    launch: "auto", "ffi", "numba" or "emulated" (module docstring).
    cache_root: a directory for files worth keeping between processes: the on-disk kernel cache
        (``<cache_root>/cubin``: a later process loads the compiled cubin instead of compiling
        for minutes), the built FFI handler (``<cache_root>/ffi``) and the generated kernel
        modules. None (default): no kernel cache; the handler and modules go to a scratch
        directory under the system's temporary directory.
    ffi_library: a prebuilt FFI handler library (.so) to use instead of building one.
    cxx: the C++ compiler that builds the FFI handler.
    kernel: which kernel runs a plain solve: "auto" (default) the warp kernel -- one trajectory
        per warp, for right-hand sides with tables and a declared linear Jacobian, such as the EB
        models (``codegen.warp``) -- and the thread kernel for every other rhs; "warp" or
        "thread" to insist on one; the same choice holds for the sensitivity kernels.
    direction_warps: the warp sensitivity kernel's direction warps per block at most (a block
        is one trajectory; its warp 0 also carries the state, its factorisation and stage
        solves, shared by the block's directions): None (default) the most its shared memory
        allows, up to four; 1 gives every (trajectory, direction) a block of its own.
    sensitivity_launch: how the tangents inside JAX programs reach the GPU: "ffi" the kernel as
        an XLA FFI custom call on XLA's stream (no copies), "host" a host callback that launches
        the sensitivity kernel on copies of its operands, "auto" (default) the custom call where
        the plain solve has the FFI launch (``use_ffi()``), else the callback (module docstring).

    ``linear_solver`` is accepted by ``solve`` for API compatibility; the kernel always uses the
    compiled unpivoted sparse LU (for a dense pattern that is a dense unpivoted LU).
    """

    name = "cuda"

    def __init__(self, launch: str = "auto", cache_root: Path | str | None = None, *,
                 ffi_library: Path | str | None = None, cxx: str = "g++", kernel: str = "auto",
                 direction_warps: int | None = None, sensitivity_launch: str = "auto"):
        if launch not in LAUNCH_MODES:
            raise ValueError(f"CudaBackend: launch must be one of {LAUNCH_MODES}, got {launch!r}")
        if sensitivity_launch not in SENSITIVITY_LAUNCHES:
            raise ValueError(f"CudaBackend: sensitivity_launch must be one of "
                             f"{SENSITIVITY_LAUNCHES}, got {sensitivity_launch!r}")
        if sensitivity_launch == "ffi" and launch in ("numba", "emulated"):
            raise ValueError(f"CudaBackend: sensitivity_launch='ffi' needs the XLA FFI launch; "
                             f"launch={launch!r} has none (give launch='auto' or 'ffi')")
        if kernel not in KERNEL_KINDS:
            raise ValueError(f"CudaBackend: kernel must be one of {KERNEL_KINDS}, got {kernel!r}")
        if direction_warps is not None and not (isinstance(direction_warps, int)
                                                 and direction_warps >= 1):
            raise ValueError("CudaBackend: direction_warps must be a positive integer or None, "
                             f"got {direction_warps!r}")
        self.launch = launch
        self.kernel = kernel
        self.direction_warps = direction_warps
        self.sensitivity_launch = sensitivity_launch
        self.cache_root = None if cache_root is None else Path(cache_root)
        work = self.cache_root if self.cache_root is not None else scratch_dir()
        self.module_dir = work
        self.kernel_cache = KernelCache(work / "cubin") if self.cache_root is not None else None
        self.ffi_library = FfiLibrary(work / "ffi", prebuilt=ffi_library, cxx=cxx)
        self.ffi = FfiLauncher(self.ffi_library, self.kernel_cache, self.module_dir, kernel)
        #: the last sensitivity launch's ``info`` (kernel cache state, compile and kernel
        #: seconds): the tangents leave through a callback that can return arrays only
        self.last_sensitivity_info = None

    def __repr__(self) -> str:
        return (f"CudaBackend(launch={self.launch!r}, cache_root={self.cache_root!r}, "
                f"kernel={self.kernel!r}, sensitivity_launch={self.sensitivity_launch!r})")

    @property
    def emulated(self) -> bool:
        return self.launch == "emulated"

    def use_ffi(self) -> bool:
        """Whether a solve launches through the XLA FFI custom call (``launch``)."""
        if self.launch in ("numba", "emulated"):
            return False
        try:
            self.ffi_library.load()
        except FfiBuildError as exc:
            if self.launch == "ffi":
                raise
            warnings.warn(f"the XLA FFI launch is unavailable ({exc}); using numba-cuda-mlir's "
                          "launch (CudaBackend(launch='numba') silences this)", RuntimeWarning,
                          stacklevel=4)
            return False
        return True

    # ------------------------------------------------------------------ plain solves
    def solve(self, rhs, inputs, *, args, rtol, max_steps, sparsity, linear_solver, controller,
              tableau):
        if linear_solver not in _LINEAR_SOLVERS:
            raise ValueError(f"linear_solver must be one of {_LINEAR_SOLVERS}, got "
                             f"{linear_solver!r}")
        table_split_of(rhs, args)  # a clear TypeError for args without rhs.table_split
        if self.emulated:
            return emulate_plain(rhs, kernel_inputs(inputs, rtol), args, sparsity, max_steps,
                                 controller, tableau, self.module_dir, self.kernel)
        if self.use_ffi():
            # fail early, with the reason, before any host-side work; the packages themselves
            # are imported only if the kernel must be compiled (not cached)
            check_cuda_packages()
            return self.ffi.solve(rhs, inputs, args=args, rtol=rtol, max_steps=max_steps,
                                  sparsity=sparsity, controller=controller, tableau=tableau)
        cuda_modules()  # fail early, with the reason, before any host-side work
        return solve_numba(rhs, kernel_inputs(inputs, rtol), args, sparsity, max_steps,
                           controller, tableau, self.module_dir, self.kernel)

    def solve_jax(self, rhs, y0, t_save, params, **kwargs):
        """The ensemble solve as a JAX computation through the XLA FFI custom call
        (:meth:`FfiLauncher.solve_jax`): usable under ``jit``, ``vmap`` folds into one launch."""
        return self.ffi.solve_jax(rhs, y0, t_save, params, **kwargs)

    # ------------------------------------------------------------------ sensitivities
    def check_sensitivities(self, spec) -> None:
        if not self.emulated:    # imported where a kernel must be compiled, not for a cached one
            check_cuda_packages() if self.kernel_cache is not None else cuda_modules()
        if spec.jacobian != "exact":
            raise ValueError("_jacobian='block_diagonal' is a JAX-backend diagnostic")
        check_args_structure(spec.rhs, spec.has_args, spec.leaf_meta)

    def _plain_host(self, rhs, inp, args, spec):
        run = emulate_plain if self.emulated else solve_numba
        return run(rhs, inp, args, spec.sparsity, spec.max_steps, spec.ctrl, spec.tableau,
                   self.module_dir, self.kernel)

    def _sens_host(self, *a, saved_states=None, **kw):
        """The sensitivity kernel's ``SensitivitySolution``, ys and dys of the states
        ``saved_states`` only (all with None): on the GPU only those cross to the host."""
        if self.emulated:
            sol = sensitivity_emulated(*a, module_dir=self.module_dir, kernel_kind=self.kernel,
                                       dir_warps=self.direction_warps, **kw)
            sol.ys = keep_states(sol.ys, saved_states)
            sol.dys = keep_states(sol.dys, saved_states)
            return sol
        return solve_sensitivities(*a, module_dir=self.module_dir,
                                   kernel_cache=self.kernel_cache, kernel_kind=self.kernel,
                                   dir_warps=self.direction_warps, saved_states=saved_states, **kw)

    def sensitivity_via_ffi(self) -> bool:
        """Whether the tangents inside JAX programs run as the sensitivity kernel's custom call
        (``sensitivity_launch``; "auto" follows the plain solve's launch, and takes the
        callback where JAX itself runs on the host: a process that only compiles kernels)."""
        if self.sensitivity_launch == "auto":
            import jax

            return not self.emulated and jax.default_backend() == "gpu" and self.use_ffi()
        return self.sensitivity_launch == "ffi"

    def solve_ys(self, spec, y0, params, args, ts, t0, te):
        """The plain kernel inside a JAX program: the XLA FFI custom call when ``use_ffi()``
        (its image from the kernel cache, as for ``solve``), else a host callback (a numba
        launch, or the emulator)."""
        import jax
        import jax.numpy as jnp

        if not self.emulated and self.use_ffi():
            table = jax.tree_util.tree_leaves(args)[0] if spec.has_args else None
            return self.ffi.solve_jax(
                spec.rhs, y0, ts, params, args=table, rtol=spec.rtol, atol=spec.atol, t0=t0,
                t_end=te, sparsity=spec.sparsity, error_weights=spec.weights,
                max_steps=spec.max_steps, first_step=spec.first_step, controller=spec.ctrl,
                tableau=spec.tableau)[0]
        N, ns = ts.shape

        def host(y0, params, tab, ts, t0, te):
            inp = prepare(y0, ts, params, spec.rtol, spec.atol, t0, te, spec.weights,
                          spec.max_steps, spec.first_step)
            sol = self._plain_host(spec.rhs, inp, tab if spec.has_args else None, spec)
            return np.asarray(sol.ys, np.float64)

        table = jax.tree_util.tree_leaves(args)[0] if spec.has_args else jnp.zeros(1)
        return jax.pure_callback(host, jax.ShapeDtypeStruct((N, ns, spec.n), jnp.float64), y0,
                                 params, table, ts, t0, te, vmap_method="sequential")

    def solve_sensitivities(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs):
        """The tangent (m, N, ns, n) from the sensitivity kernel (host callback): the warp
        kernel's blocks of a trajectory's directions, or the thread kernel's thread per
        (trajectory, direction); a trajectory with a failed direction is NaN at the save times
        that direction did not reach, in every direction (``dys_or_nan``)."""
        return self._sensitivity_callback(spec, y0, params, leaves, ts, t0, te, dy0, dp, dargs,
                                          with_ys=False)

    def solve_with_sensitivities(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp,
                                 dargs, states=None):
        """(ys (N, ns, n), dys (m, N, ns, n)) from one sensitivity-kernel launch: the states of
        each trajectory's direction-0 thread, whose steps also control that direction's
        sensitivity (so ys equals the plain solve's to the tolerance, as the JAX backend's joint
        solve gives it), NaN where ``dys`` is. No plain solve runs beside it: a Jacobian then
        neither launches nor, in a first process, compiles the plain kernel of its model.
        ``states``: ys and dys of those states only (the host copies and the results shrink
        with them)."""
        return self._sensitivity_callback(spec, y0, params, leaves, ts, t0, te, dy0, dp, dargs,
                                          with_ys=True, states=states)

    def _sensitivity_callback(self, spec, y0, params, leaves, ts, t0, te, dy0, dp, dargs, *,
                              with_ys, states=None):
        import jax
        import jax.numpy as jnp

        present = [x for x in (dy0, dp) if x is not None] + list(dargs)
        m = present[0].shape[0]
        N, n = y0.shape
        ns = ts.shape[1]
        s0 = jnp.zeros((m, N, n)) if dy0 is None else jnp.asarray(dy0, jnp.float64)
        dpp = jnp.zeros((m, N, spec.P)) if dp is None else jnp.asarray(dp, jnp.float64)
        table = leaves[0] if spec.has_args else jnp.zeros(1)
        if self.sensitivity_via_ffi():
            self.ffi_library.load()      # FfiBuildError (with its reason) where it cannot be
            # the kernel's registration (at trace time): the launch itself runs in the program
            self.last_sensitivity_info = {"launch": "xla-ffi"}
            return sensitivities_jax(
                self.ffi, spec, y0, params, table, ts, t0, te, s0, dpp,
                jnp.asarray(dargs[0], jnp.float64) if dargs else None, kernel_kind=self.kernel,
                dir_warps=self.direction_warps, with_ys=with_ys, states=states,
                info=self.last_sensitivity_info)
        ops = [y0, params, table, ts, t0, te, s0, dpp]
        ops += [jnp.asarray(d, jnp.float64) for d in dargs]   # at most the one table leaf

        def host(y0, params, tab, ts, t0, te, s0, dp, *da):
            t_host = time.perf_counter()
            sol = self._sens_host(
                spec.rhs, y0, ts, params, s0=s0, dparams=dp if spec.P else None,
                dargs=da[0] if da else None, args=tab if spec.has_args else None,
                rtol=spec.rtol, atol=spec.atol, sensitivity_atol=spec.sens_atol,
                sensitivity_error_control=spec.sec, t0=t0, t_end=te, sparsity=spec.sparsity,
                error_weights=spec.weights, max_steps=spec.max_steps,
                first_step=spec.first_step, controller=spec.ctrl, tableau=spec.tableau,
                saved_states=states)
            out = (sol.ys_or_nan(), sol.dys_or_nan()) if with_ys else sol.dys_or_nan()
            # the callback's own wall seconds (launch, copies, NaN marks): the rest of a
            # caller's stage is JAX moving the operands here and the result back
            self.last_sensitivity_info = dict(sol.info) | {
                "callback_seconds": time.perf_counter() - t_host}
            return out

        dys_shape = jax.ShapeDtypeStruct((m, N, ns, n if states is None else len(states)),
                                         jnp.float64)
        shapes = (jax.ShapeDtypeStruct(dys_shape.shape[1:], jnp.float64), dys_shape) if with_ys \
            else dys_shape
        return jax.pure_callback(host, shapes, *ops, vmap_method="sequential")

    def joint_solve(self, spec, mask, y0, params, leaves, ts, t0, te, dy0, dp, dargs):
        """info per trajectory (status: OK unless a direction failed; step counts: the most over
        its directions), per thread (``thread_*``, (m, N)) and the launch's own (``launch``)."""
        import jax.numpy as jnp

        sol = self._sens_host(
            spec.rhs, np.asarray(y0), np.asarray(ts), np.asarray(params),
            s0=None if dy0 is None else np.asarray(dy0),
            dparams=None if dp is None else np.asarray(dp),
            dargs=np.asarray(dargs[0]) if dargs else None,
            args=np.asarray(leaves[0]) if spec.has_args else None, rtol=spec.rtol,
            atol=spec.atol, sensitivity_atol=spec.sens_atol, sensitivity_error_control=spec.sec,
            t0=np.asarray(t0), t_end=np.asarray(te), sparsity=spec.sparsity,
            error_weights=spec.weights, max_steps=spec.max_steps, first_step=spec.first_step,
            controller=spec.ctrl, tableau=spec.tableau)
        info = {"status": sol.trajectory_status(), "n_accepted": sol.n_accepted.max(axis=0),
                "n_rejected": sol.n_rejected.max(axis=0), "thread_status": sol.status,
                "thread_n_accepted": sol.n_accepted, "thread_n_rejected": sol.n_rejected,
                "launch": sol.info}
        return jnp.asarray(sol.ys), jnp.asarray(sol.dys_or_nan()), info
