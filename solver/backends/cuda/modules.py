"""Generated kernel text as an importable module, and the device globals it expects.

numba's front end (and tracebacks through a kernel) read a function's source through
``inspect``/``linecache``, so the generated text is written to a real file, named by its hash, and
imported from there. :func:`bind_gpu` then injects what the text leaves undefined (``cuda``,
``F64``, the device RHS and its Enzyme derivatives, the table lookups); the CPU emulator binds its
own stand-ins instead.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path

from ...files import atomic_write
from .toolchain import cuda_modules

__all__ = ["scratch_dir", "load_module", "device_functions", "bind_gpu"]


def scratch_dir() -> Path:
    """Where generated files go when the backend has no cache root: a fixed directory under the
    system's temporary directory (files are named by content hash, so processes share them)."""
    return Path(tempfile.gettempdir()) / "boltzmann_cuda_kernels"


def load_module(source: str, stem: str, tag: str, owner: int, directory: Path | None = None):
    """Import generated kernel text from ``directory/<stem>_<hash>.py`` (default
    :func:`scratch_dir`). Returns (module, path)."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    root = Path(directory) if directory is not None else scratch_dir()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{stem}_{digest}.py"
    if not path.exists() or path.read_text() != source:
        atomic_write(path, source.encode())
    name = f"_{stem}_{tag}_{digest}_{owner}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod, str(path)


def device_functions(plan) -> dict:
    """The Python functions compiled into a kernel besides ``plan.source``, by the module global
    each becomes: ``rhs`` (the differentiated primal: the table split's core, or the rhs itself)
    and, with tables, the lookups ``table_values`` / ``table_values_dt``.  :func:`bind_gpu`
    compiles exactly these, and the kernel cache fingerprints them for its key."""
    split = getattr(plan, "split", None)
    if split is not None:
        return {"rhs": split.core_device, "table_values": split.lookup_device,
                "table_values_dt": split.lookup_dt_device}
    return {"rhs": plan.rhs}


def bind_gpu(mod, plan, second_order: bool = False):
    """Inject the numba-cuda-mlir / numba-enzyme-cuda globals a generated module expects (see
    ``codegen.plain``): ``cuda``, ``F64``, the device primal ``rhs`` (the table-free core with
    tables), its Enzyme ``jvp_rhs``, with ``second_order`` also ``jvp2_rhs`` = jvp(jvp_rhs) (the
    second-order sweep of the sensitivity kernel), and the table lookups.
    Returns the ``cuda`` module."""
    cuda, types, jvp = cuda_modules()
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
