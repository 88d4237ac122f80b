"""Process-wide settings, applied once by the entry points (the CLI, the scripts, the public API).

Two things are global to a JAX process and so cannot be left to each stage: float64 (every stage
computes in double precision; JAX defaults to single) and JAX's persistent compilation cache,
which keeps the compiled XLA programs (tables, initial conditions, the JAX-backend solve,
observables, the Jacobian programs) between processes so that a second run does not compile
again. The CUDA backend keeps its compiled kernels and FFI handler under the same cache root
(``solver.CudaBackend(cache_root=...)``), and host-built tables that cost seconds to make (the
CMB's spherical Bessel table) live in its ``tables`` folder (``persistent_dir``). The traced form of
the large programs (``solver.persisted``) lives in its ``exported`` folder: with it a second run
neither traces nor lowers them.

Environment variables are read here and only here (``Settings.from_environment``), by the entry
points; the library itself takes arguments.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import jax

__all__ = ["Settings", "CompileCounter", "configure", "use_float64", "require_float64",
           "default_cache_root", "clear_cache", "backend_for", "persistent_dir",
           "size_host_pool", "accelerator_visible", "host_pool_description",
           "ACCELERATOR_HOST_THREADS"]

#: folder names under the cache root
XLA_DIR = "xla"
CUDA_DIR = "cuda"
TABLES_DIR = "tables"
#: the traced form of the large programs (``solver.persisted``, ``jax.export``)
EXPORTED_DIR = "exported"

#: the cache root ``configure`` set up in this process (None: no persistent cache)
_configured_root: Path | None = None


def persistent_dir(name: str) -> Path | None:
    """The folder ``name`` under the cache root that ``configure`` set up in this process, or
    None when it set none (or was not called): callers then keep their data in memory only."""
    return None if _configured_root is None else _configured_root / name


def default_cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """``$BOLTZMANN_CACHE_DIR``, else ``$XDG_CACHE_HOME/boltzmann-gpu``, else
    ``~/.cache/boltzmann-gpu``."""
    if environ.get("BOLTZMANN_CACHE_DIR"):
        return Path(environ["BOLTZMANN_CACHE_DIR"]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "boltzmann-gpu"


@dataclass(frozen=True)
class Settings:
    """What an entry point configures.

    cache_root: the persistent cache's folder, or None for no persistent cache;
    cuda_launch: the CUDA backend's launch ("auto", "ffi", "numba"; solver.CudaBackend);
    ffi_library: a prebuilt FFI handler library for the CUDA backend, or None to build one;
    cxx: the C++ compiler that builds the handler;
    host_threads: the size of XLA:CPU's thread pool (``size_host_pool``); None or 0 for JAX's
        default (one thread per CPU the process may use). ``from_environment`` picks
        ``ACCELERATOR_HOST_THREADS`` where an accelerator is visible and the variable is unset;
    direction_warps: the CUDA sensitivity kernel's direction warps per block at most
        (``solver.CudaBackend(direction_warps=)``), or None for the kernel's own;
    cuda_sensitivity_launch: how the CUDA backend's tangents are launched inside JAX programs
        ("auto", "host" or "ffi"; ``solver.CudaBackend(sensitivity_launch=)``).
    """

    cache_root: Path | None = None
    cuda_launch: str = "auto"
    ffi_library: Path | None = None
    cxx: str = "g++"
    host_threads: int | None = None
    direction_warps: int | None = None
    cuda_sensitivity_launch: str = "auto"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ, *,
                         cache_root: Path | str | None = None, no_cache: bool = False):
        """Settings from the environment: BOLTZMANN_CACHE_DIR / XDG_CACHE_HOME (cache root;
        BOLTZMANN_CACHE=0 turns the cache off), BOLTZMANN_CUDA_LAUNCH, BOLTZMANN_FFI_LIB, CXX,
        BOLTZMANN_HOST_THREADS (a positive integer, or ``all`` for JAX's pool; unset: one thread
        where an accelerator is visible, see ``ACCELERATOR_HOST_THREADS``),
        BOLTZMANN_DIRECTION_WARPS, BOLTZMANN_CUDA_SENS_LAUNCH. Explicit arguments (the CLI's
        options) take precedence."""
        off = environ.get("BOLTZMANN_CACHE", "1").strip().lower() in ("0", "off", "false", "no")
        if no_cache or (off and cache_root is None):
            root = None
        else:
            root = Path(cache_root).expanduser() if cache_root else default_cache_root(environ)
        lib = environ.get("BOLTZMANN_FFI_LIB")
        threads = environ.get("BOLTZMANN_HOST_THREADS", "").strip().lower()
        if threads == "all":
            pool = 0
        elif threads:
            if not (threads.isdigit() and int(threads) > 0):
                raise ValueError(f"BOLTZMANN_HOST_THREADS={threads!r}: give a positive integer "
                                 "(the size of XLA:CPU's thread pool), 'all' (a thread per CPU) "
                                 "or leave it unset")
            pool = int(threads)
        else:
            pool = ACCELERATOR_HOST_THREADS if accelerator_visible(environ) else None
        warps = environ.get("BOLTZMANN_DIRECTION_WARPS", "").strip()
        if warps and not (warps.isdigit() and int(warps) > 0):
            raise ValueError(f"BOLTZMANN_DIRECTION_WARPS={warps!r}: give a positive integer (the "
                             "CUDA sensitivity kernel's direction warps per block at most) or "
                             "leave it unset")
        sens_launch = environ.get("BOLTZMANN_CUDA_SENS_LAUNCH", "auto").strip() or "auto"
        if sens_launch not in ("auto", "host", "ffi"):
            raise ValueError(f"BOLTZMANN_CUDA_SENS_LAUNCH={sens_launch!r}: give 'ffi' (an XLA "
                             "FFI custom call), 'host' (the sensitivity kernel from a host "
                             "callback), 'auto' or leave it unset (the custom call wherever the "
                             "plain solve has the FFI launch)")
        return cls(cache_root=root, cuda_launch=environ.get("BOLTZMANN_CUDA_LAUNCH", "auto"),
                   ffi_library=Path(lib) if lib else None, cxx=environ.get("CXX") or "g++",
                   host_threads=pool,
                   direction_warps=int(warps) if warps else None,
                   cuda_sensitivity_launch=sens_launch)


class CompileCounter:
    """XLA programs of this process compiled afresh and loaded from the persistent cache (from
    JAX's monitoring events; both stay 0 when the cache is off)."""

    def __init__(self):
        self.compiled = 0
        self.loaded = 0

    def __call__(self, event: str, **kwargs) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.loaded += 1
        elif event == "/jax/compilation_cache/cache_misses":
            self.compiled += 1

    def as_dict(self) -> dict:
        return {"xla_programs_compiled": self.compiled, "xla_programs_loaded": self.loaded}


def configure(settings: Settings = Settings()) -> CompileCounter:
    """float64 on, and JAX's persistent compilation cache under ``settings.cache_root``; returns
    a counter of this process's compilations from here on.

    Every compiled program is cached, however quick its compile: a run compiles a few large
    programs and many small ones, and the small ones add up to most of a second run's wait.
    JAX writes each entry atomically, so a sampler's workers can share one cache.
    """
    global _configured_root
    if settings.host_threads:
        size_host_pool(settings.host_threads)
    use_float64()
    counter = CompileCounter()
    jax.monitoring.register_event_listener(counter)
    _configured_root = settings.cache_root
    from solver import set_program_store
    set_program_store(None if settings.cache_root is None else settings.cache_root / EXPORTED_DIR)
    if settings.cache_root is None:
        return counter
    xla = settings.cache_root / XLA_DIR
    xla.mkdir(parents=True, exist_ok=True)
    drop_unreadable_entries(xla)
    jax.config.update("jax_compilation_cache_dir", str(xla))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return counter


#: XLA:CPU's pool size where an accelerator runs the solves and the variable is unset. The host
#: still computes the tables of a few cosmologies and the Jacobian's inputs (tables and their
#: tangents), thousands of small operations in sequence; on 16-core GPU hosts one thread did
#: both in about half the time of a thread per core (docs/benchmarks.md, "the host's thread
#: pool": tables 24-28 against 43-48 ms, the Jacobian's inputs 102-107 against 191-224 ms).
#: A CPU-only run keeps JAX's pool: there the solves themselves run on it.
ACCELERATOR_HOST_THREADS = 1

#: the JAX plugins that bring an NVIDIA GPU backend
_GPU_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13",
                "jax_plugins.xla_cuda12")


def _gpu_plugin_installed() -> bool:
    import importlib.util

    for name in _GPU_PLUGINS:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def _gpu_device_nodes() -> list[str]:
    import glob

    return glob.glob("/dev/nvidia[0-9]*")


def host_pool_description(host_threads: int | None) -> str:
    """How a report names XLA:CPU's pool of ``Settings.host_threads``."""
    return f"{host_threads} thread(s)" if host_threads else "JAX's own (a thread per CPU)"


def accelerator_visible(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether JAX will find an NVIDIA GPU, judged without creating its backends (the pool must
    be sized before they exist): a GPU plugin installed, a GPU device node present, and neither
    JAX_PLATFORMS nor CUDA_VISIBLE_DEVICES ruling GPUs out."""
    platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms and not any(p in platforms for p in ("cuda", "gpu")):
        return False
    if environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return False
    return bool(_gpu_device_nodes()) and _gpu_plugin_installed()


def size_host_pool(n_threads: int) -> bool:
    """Initialise JAX's backends with XLA:CPU's thread pool sized to ``n_threads``; False (and
    nothing changed) when the backends already exist or the platform cannot set affinities.

    Why: on an accelerator the host CPU still runs the tables' node-to-node loop for a few
    cosmologies — thousands of tiny operations — and XLA:CPU hands them to a pool with a thread
    per CPU. On a 16-core host that costs more than the arithmetic: one cosmology's tables took
    2.5x longer there than with the process on one core (docs/benchmarks.md, host tables).
    XLA sizes the pool from the process's CPU affinity when the backends are created, so the
    affinity is narrowed for that moment and restored at once (threads created meanwhile keep
    the narrow set).
    """
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized() or not hasattr(os, "sched_setaffinity"):
        return False
    cpus = sorted(os.sched_getaffinity(0))
    if int(n_threads) >= len(cpus):
        return False
    os.sched_setaffinity(0, cpus[:int(n_threads)])
    try:
        jax.devices()
    finally:
        os.sched_setaffinity(0, cpus)
    return True


def drop_unreadable_entries(xla_dir: Path) -> list[Path]:
    """Delete the compilation-cache entries that do not decompress (a disk error, a crash of
    another writer's file system): JAX skips an unreadable entry and compiles, but never replaces
    it, so every later run would compile again. Returns what was deleted."""
    try:
        from jax._src.compilation_cache import decompress_executable
    except ImportError:        # another JAX layout: leave the entries to JAX
        return []
    dropped = []
    for path in Path(xla_dir).glob("*-cache"):
        try:
            decompress_executable(path.read_bytes())
        except Exception:  # noqa: BLE001 - any failure means JAX cannot read it either
            path.unlink(missing_ok=True)
            dropped.append(path)
    return dropped


def use_float64() -> None:
    """JAX in double precision (what every stage computes in)."""
    jax.config.update("jax_enable_x64", True)


def require_float64() -> None:
    """Raise a clear error when JAX computes in single precision."""
    if not jax.config.jax_enable_x64:
        raise RuntimeError(
            "boltzmann computes in float64: call jax.config.update('jax_enable_x64', True) (or "
            "boltzmann.runtime.configure()) before the first computation")


def clear_cache(settings: Settings) -> list[Path]:
    """Delete the persistent cache's folders; returns what was removed."""
    removed = []
    if settings.cache_root is not None:
        for name in (XLA_DIR, CUDA_DIR, TABLES_DIR, EXPORTED_DIR):
            path = settings.cache_root / name
            if path.exists():
                shutil.rmtree(path)
                removed.append(path)
    return removed


def backend_for(name: str, settings: Settings = Settings(), kernel: str = "auto"):
    """The solver backend for "jax", "cuda" or "auto" with the settings' CUDA options: "jax", or
    a ``solver.CudaBackend`` keeping its kernels under the cache root (``kernel``: its
    ``CudaBackend(kernel=)``, "auto" = the warp kernel for the EB models)."""
    from solver import CudaBackend, pick_backend

    if name == "auto":
        name = pick_backend()
    if name != "cuda":
        return name
    root = None if settings.cache_root is None else settings.cache_root / CUDA_DIR
    return CudaBackend(launch=settings.cuda_launch, cache_root=root,
                       ffi_library=settings.ffi_library, cxx=settings.cxx, kernel=kernel,
                       direction_warps=settings.direction_warps,
                       sensitivity_launch=settings.cuda_sensitivity_launch)
