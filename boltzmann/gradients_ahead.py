"""The work a ``PowerSpectrumFunction`` can do before, or beside, its Jacobian call.

A one-shot process (the CLI's ``--gradients``) computes the main job first and the Jacobian
after it. A later process spends much of the Jacobian's wait loading programs an earlier one
stored, which need not wait for the main job:

* ``preload`` loads the stored inputs and solve programs in background threads while the main
  job runs. In a first run (nothing stored) it compiles the inputs program there only on a GPU
  machine, whose host CPU runs that program and has memory to spare: there its XLA:CPU compile
  (most of the first Jacobian's wait) runs beside the main job's kernel compile. On a CPU-only
  machine it would add the compile's gigabytes to the process's peak. Nor is the inputs stage
  computed ahead on a GPU machine's host: in a second process with it, the main job's host
  tables took 8.7 s and its perturbation stage 8.7 s (NVIDIA H100), against about 1 s each in
  earlier second processes without it (docs/benchmarks.md), more than the Jacobian's wait it
  removed;
* ``_solve_groups`` runs the JAX backend's chunk groups of the joint solve at the same time;
* on a CUDA backend with a kernel cache, ``preload`` also starts a helper process that compiles
  the sensitivity kernel while the main job runs (``boltzmann.kernel_helper``, using
  ``warm_sensitivity_kernel``), and ``jacobian`` waits for it before its solve.

``PowerSpectrumFunction`` inherits these (``AheadOfCall``); the attributes they read are set
by its constructor.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from solver.backends.registry import resolve_backend

from . import kernel_helper
from .tables import host_cpu

log = logging.getLogger(__name__)

__all__ = ["AheadOfCall", "solve_device", "solve_sharding", "parallel_solves", "run_on_host"]


def solve_device():
    """Where the Jacobian's solve and outputs run (and ``_host_inputs`` puts the inputs computed
    on the host): the device a ``jax.default_device`` context names, else the default backend's
    first device -- so a caller can run the whole Jacobian on the host CPU of a GPU machine."""
    device = jax.config.jax_default_device
    if isinstance(device, str):
        return jax.devices(device)[0]
    return device if device is not None else jax.devices()[0]


def run_on_host(program, theta, cpu):
    """``program(theta)`` on the host CPU device ``cpu`` (θ put there), its result moved to
    ``solve_device()``; ``cpu`` None: where θ is. Why: the inputs stages' tables run a
    sequential scan, at kernel-launch latency on a GPU (``tables.HOST_TABLES_MAX``)."""
    if cpu is None:
        return jax.block_until_ready(program(theta))
    target = solve_device()
    with jax.default_device(cpu):
        out = program(jax.device_put(theta, cpu))
    return jax.device_put(out, target)


def solve_sharding():
    """``solve_device()`` as the sharding the solve program's arguments are committed to."""
    return jax.sharding.SingleDeviceSharding(solve_device())


def parallel_solves() -> int:
    """How many chunk groups the JAX backend's Jacobian solves at the same time: 2 on a CPU
    with two or more cores, else 1 (one accelerator runs one at a time anyway)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return 2 if jax.default_backend() == "cpu" and cores >= 2 else 1


class AheadOfCall:
    """Background loads and parallel solves for ``PowerSpectrumFunction.jacobian`` (module
    docstring). Expects ``theta0``, ``inputs_on_host``, ``_jit_inputs_jvp``,
    ``_jit_solve_jvp``, ``_chunk_groups``, ``_host_inputs`` and, for the sensitivity kernel,
    ``_jit_stage_inputs``, ``_solve_and_tangents``, ``_chunks`` and ``_map`` of the class it is mixed
    into."""

    #: the threads loading the stored programs (``preload``), empty when none runs
    _preloading: tuple[threading.Thread, ...] = ()
    #: the helper process compiling the sensitivity kernel (``preload``), None when none runs
    _kernel_helper = None
    #: the last ``jacobian``'s wait for the helper: {"waited_s", "succeeded"}, or None
    last_kernel_helper: dict | None = None

    def preload(self, theta=None) -> bool:
        """Start loading the Jacobian's stored programs, a background thread each -- the inputs
        program (on the host CPU where the inputs run there) and the solve program -- when an
        earlier process stored them (``solver.persisted``), and return True. When the inputs
        program is not stored: where the inputs run on a GPU machine's host
        (``inputs_on_host``), start a thread that traces, stores and compiles it
        (``PersistedProgram.load(build=True)``) and return True; elsewhere return False, having
        started no thread. On a CUDA backend that keeps a kernel cache, also start the helper
        process that compiles the sensitivity kernel unless an earlier one stored it
        (``boltzmann.kernel_helper``; a process apart, so it returns no flag).

        Why: a later process spends most of its wait before the Jacobian loading its programs
        -- XLA:CPU rebuilding each program's instruction list, single-threaded and with the
        GIL released: about 20 s for the solve program on the 2-core CPU, 4 s for the inputs
        program on a GPU machine's host -- while it computes the main job, which it can do at
        the same time. ``jacobian`` then finds the programs ready (or waits for the load to
        finish; a program's lock keeps it from loading twice); θ only sets the arguments'
        shapes. Only loads: running the inputs program ahead slowed the main job (module
        docstring)."""
        theta = self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)
        if self._kernel_helper is None:
            self._kernel_helper = kernel_helper.start(self, theta)
        cpu, placed = self._inputs_theta(theta)
        with jax.default_device(cpu) if cpu is not None else contextlib.nullcontext():
            shapes = self._jit_inputs_jvp.stored_output_shapes(theta)
        if shapes is None:
            if cpu is None:
                return False
            self._start_loads([(self._jit_inputs_jvp, (placed,), True)], cpu)
            return True
        loads = [(self._jit_inputs_jvp, (placed,), False)]
        (table, rows, y0, _), (dtable, drows, dy0, _) = shapes
        arrays = (table, rows, y0, dtable, drows, dy0)
        if self._chunk_groups is not None:
            arrays += (self._chunk_groups[0],)
        args = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=solve_sharding())
                     for a in arrays)
        if self._jit_solve_jvp.has_stored(*args):
            loads.append((self._jit_solve_jvp, args, False))
        self._start_loads(loads, cpu)
        return True

    def _start_loads(self, loads, cpu) -> None:
        """A background thread per (program, its arguments, build) of ``loads``: the program
        loaded (and with ``build`` compiled when not stored), the inputs program under the
        default device its call uses (``_host_inputs``); ``_preloading`` holds the threads."""
        inputs = self._jit_inputs_jvp

        def load(program, program_args, build):
            on_host = cpu is not None and program is inputs
            try:
                with jax.default_device(cpu) if on_host else contextlib.nullcontext():
                    program.load(*program_args, build=build)
            except Exception as exc:  # noqa: BLE001 - the call then loads or compiles it itself
                log.warning("preloading a Jacobian program failed (%s: %s)",
                            type(exc).__name__, exc)

        self._preloading = tuple(threading.Thread(target=load, args=entry, daemon=True,
                                                  name="boltzmann-preload") for entry in loads)
        for thread in self._preloading:
            thread.start()

    def _inputs_theta(self, theta):
        """(the host CPU device the inputs stage runs on, or None where it runs where θ is; θ
        placed there): one placement for the call (``_host_inputs``) and the load ahead
        (``preload``), since an argument's placement is part of XLA's cache key."""
        cpu = host_cpu() if self.inputs_on_host else None
        return cpu, theta if cpu is None else jax.device_put(theta, cpu)

    def _solve_groups(self, solve_args):
        """(ys, dys): the solve program on every chunk group, the groups at the same time.

        Why threads: XLA:CPU runs one execution of the lock-step loop mostly on one core (its
        thousands of small kernels a step depend on each other), and two executions of the
        same program run side by side: the ``--gradients`` second run's solve stage took 33.4 s
        against 53.4 s in turn on the 2-core CPU (``scripts/bench_first_run.py``,
        docs/benchmarks.md). Each run returns every mode, zero outside its group, so the sum is
        the whole."""
        if self._chunk_groups is None:
            return jax.block_until_ready(self._jit_solve_jvp(*solve_args))

        def run(index):
            index = jax.device_put(index, solve_sharding())
            return jax.block_until_ready(self._jit_solve_jvp(*solve_args, index))

        if len(self._chunk_groups) == 1:
            return run(self._chunk_groups[0])
        with ThreadPoolExecutor(len(self._chunk_groups), "boltzmann-solve") as pool:
            parts = list(pool.map(run, self._chunk_groups))
        return jax.tree_util.tree_map(lambda *xs: sum(xs[1:], xs[0]), *parts)

    def _wait_for_kernel_helper(self) -> None:
        """Wait for the helper process ``preload`` started (the solve then loads the kernel it
        stored; if it failed, the solve compiles the kernel); the wait is ``last_kernel_helper``."""
        helper, self._kernel_helper = self._kernel_helper, None
        if helper is None:
            self.last_kernel_helper = None
            return
        t0 = time.perf_counter()
        ok = helper.wait()
        self.last_kernel_helper = {"waited_s": time.perf_counter() - t0, "succeeded": ok,
                                   "helper_seconds": helper.timeline}

    def warm_sensitivity_kernel(self, theta=None) -> dict:
        """Compile, or load from the kernel cache, the CUDA sensitivity kernel ``jacobian``
        launches, by one sensitivity solve of the lowest-k mode (the fewest steps) with zero
        tangents at θ, and return that launch's info (its kernel-cache key, compile seconds) with
        ``inputs_seconds``, the time to the solve's inputs (their programs' compiles included).
        What ``kernel_helper``'s process runs: the Jacobian's own solve (``_solve_and_tangents``)
        on one chunk of one mode, so the kernel's source, argument types and options are the
        Jacobian's. A CUDA-backend method: the JAX backend's solve takes chunk groups as arrays."""
        theta = self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)
        t0 = time.perf_counter()
        table, rows, y0, _ = jax.block_until_ready(self._jit_stage_inputs(theta))
        inputs_seconds = time.perf_counter() - t0
        m = len(self._map.solve_directions)

        def zero(a):
            return jnp.zeros((m,) + a.shape, a.dtype)

        lowest = np.asarray(self._chunks[0])[:1]
        jax.block_until_ready(self._solve_and_tangents(table, rows, y0, zero(table), zero(rows),
                                                       zero(y0), index=[lowest]))
        info = dict(getattr(resolve_backend(self.backend), "last_sensitivity_info", None) or {})
        return info | {"inputs_seconds": inputs_seconds}

    def _wait_for_preload(self) -> None:
        """Wait for ``preload``'s background work (before ``jax.clear_caches`` may run)."""
        threads, self._preloading = self._preloading, ()
        for thread in threads:
            thread.join()

