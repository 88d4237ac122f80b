"""The work a ``PowerSpectrumFunction`` can do before, or beside, its Jacobian call.

A one-shot process (the CLI's ``--gradients``) computes the main job first and the Jacobian
after it. Much of the Jacobian's wait is compiling or loading programs, which need not wait for
the main job:

* ``preload`` starts, in background threads, what can run beside the main job without adding a
  compile's memory to a small machine's peak: loading the solve program an earlier process
  stored (any machine), and on an accelerator also computing the inputs stage -- θ → tables,
  rows, initial states and their tangents, an XLA:CPU program on the host -- whose compile
  then overlaps the main job's (the GPU host has the cores and memory for both);
* ``_solve_groups`` runs the JAX backend's chunk groups of the joint solve at the same time.

``PowerSpectrumFunction`` inherits these (``AheadOfCall``); the attributes they read are set
by its constructor.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from .tables import host_cpu

log = logging.getLogger(__name__)

__all__ = ["AheadOfCall", "solve_sharding", "parallel_solves"]


def solve_sharding():
    """Where the Jacobian's solve program runs: the default backend's first device (where
    ``_host_inputs`` puts the inputs computed on the host)."""
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def parallel_solves() -> int:
    """How many chunk groups the JAX backend's Jacobian solves at the same time: 2 on a CPU
    with two or more cores, else 1 (one accelerator runs one at a time anyway)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return 2 if jax.default_backend() == "cpu" and cores >= 2 else 1


class AheadOfCall:
    """Background loads and computations for ``PowerSpectrumFunction.jacobian`` (module
    docstring). Expects ``theta0``, ``inputs_on_host``, ``_jit_inputs_jvp``,
    ``_jit_solve_jvp``, ``_chunk_groups`` and ``_host_inputs`` of the class it is mixed into."""

    #: the thread loading the stored solve program (``preload``), None when none runs
    _preloading: threading.Thread | None = None
    #: (θ's bytes, the future of the inputs stage's result at θ) started by ``preload``
    _prefetched: tuple[bytes, Future] | None = None

    def preload(self, theta=None) -> bool:
        """Start, in background threads, what the Jacobian at θ will need and can get ahead of
        its call, and return whether anything started:

        * on an accelerator (``inputs_on_host``), the inputs stage at θ on the host CPU --
          compiled, or loaded when an earlier process stored it -- whose result ``jacobian(θ)``
          then takes instead of computing it;
        * the solve program, when an earlier process stored it (``solver.persisted``). What is
          not stored is not compiled beside the caller's work: on a CPU-only machine that would
          add the compile's gigabytes to the process's peak.

        Why: a later process on the 2-core CPU spends most of its wait before the Jacobian
        loading its programs -- XLA:CPU rebuilding the solve program's instruction list takes
        about 20 s, single-threaded -- while it computes the main job, which it can do at the
        same time; on a GPU machine the inputs program's XLA:CPU compile (a first run) or load
        runs on host cores the main job leaves idle. θ (default: the fiducial) also sets the
        solve program's argument shapes."""
        theta = self.theta0 if theta is None else jnp.asarray(theta, jnp.float64)
        started = self._prefetch_inputs(theta)
        cpu = host_cpu() if self.inputs_on_host else None
        with jax.default_device(cpu) if cpu is not None else contextlib.nullcontext():
            shapes = self._jit_inputs_jvp.stored_output_shapes(theta)
        if shapes is None:
            return started
        (table, rows, y0, _), (dtable, drows, dy0, _) = shapes
        arrays = (table, rows, y0, dtable, drows, dy0)
        if self._chunk_groups is not None:
            arrays += (self._chunk_groups[0],)
        args = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=solve_sharding())
                     for a in arrays)
        if not self._jit_solve_jvp.has_stored(*args):
            return started

        def load():
            try:
                self._jit_solve_jvp.load(*args)
            except Exception as exc:  # noqa: BLE001 - the call then loads or compiles it itself
                log.warning("preloading the Jacobian's solve program failed (%s: %s)",
                            type(exc).__name__, exc)

        self._preloading = threading.Thread(target=load, name="boltzmann-preload", daemon=True)
        self._preloading.start()
        return True

    def _prefetch_inputs(self, theta) -> bool:
        """Start the inputs stage at θ in a background thread where it runs on the host CPU
        beside an accelerator (``inputs_on_host``); False, having started nothing, elsewhere."""
        if not self.inputs_on_host or host_cpu() is None:
            return False
        pool = ThreadPoolExecutor(1, "boltzmann-inputs")
        self._prefetched = (np.asarray(theta).tobytes(),
                            pool.submit(self._host_inputs, self._jit_inputs_jvp, theta))
        pool.shutdown(wait=False)
        return True

    def _inputs_at(self, theta):
        """The inputs stage's result at θ: the one ``preload`` computed for this θ, else
        computed now. A prefetch that failed is computed again here, where its error is
        raised to the caller."""
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] == np.asarray(theta).tobytes():
            try:
                return prefetched[1].result()
            except Exception as exc:  # noqa: BLE001 - raised again by the computation below
                log.warning("the Jacobian's inputs computed ahead failed (%s: %s)",
                            type(exc).__name__, exc)
        elif prefetched is not None:
            prefetched[1].cancel()
        return jax.block_until_ready(self._host_inputs(self._jit_inputs_jvp, theta))

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

    def _wait_for_preload(self) -> None:
        """Wait for ``preload``'s background work (before ``jax.clear_caches`` may run)."""
        thread, self._preloading = self._preloading, None
        if thread is not None:
            thread.join()
        if self._prefetched is not None:
            concurrent_wait(self._prefetched[1])


def concurrent_wait(future: Future) -> None:
    """Wait for ``future`` to finish, whatever its outcome."""
    try:
        future.exception()
    except Exception:  # noqa: BLE001 - cancelled: nothing runs
        pass
