"""The C++ XLA FFI handler that launches the kernel on XLA's stream: build, load, register.

``csrc/rodas_ffi.cc`` uses XLA's typed FFI API and no CUDA headers: it dlopens ``libcuda.so.1`` at
run time and resolves ``cuModuleLoadData``, ``cuModuleGetFunction``, ``cuLaunchKernel``, ... with
dlsym. It is compiled with ``g++ -O2 -shared -fPIC -std=c++17`` against ``jax.ffi.include_dir()``
into ``<build_dir>/rodas_ffi_<hash>.so``, the hash covering its source, the jax/jaxlib versions and
the flags, so a build is reused until one of them changes. On a machine without a compiler, build
it elsewhere (``FfiLibrary(build_dir=DIR).build()``) and pass the .so as ``prebuilt``.

One handler serves a process: XLA's FFI target registry is per process and keyed by name, so the
first library loaded is registered and every backend of the process launches through it (all
builds of one source are interchangeable; the ABI version is checked at load). Kernel images are
registered with its table under process-unique keys. Those facts live in this module
(``_PROCESS``) because they are process-wide; they are never cleared.
"""
from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import shutil
import subprocess
import threading
from pathlib import Path

from .toolchain import CudaBackendUnavailable

__all__ = ["FfiLibrary", "FfiBuildError", "SOURCE", "TARGET_NAME", "PROBE_TARGET_NAME",
           "ABI_VERSION"]

SOURCE = Path(__file__).with_name("csrc") / "rodas_ffi.cc"
TARGET_NAME = "boltzmann_rodas_solve"            # platform CUDA
PROBE_TARGET_NAME = "boltzmann_rodas_pack_probe"  # platform cpu (tests: packing without a GPU)
HANDLER_SYMBOL = "BoltzmannRodasSolve"
PROBE_SYMBOL = "BoltzmannRodasPackProbe"
ABI_VERSION = 2
CXX_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++17")
_SYMBOLS = (HANDLER_SYMBOL, PROBE_SYMBOL, "rodas_ffi_abi_version", "rodas_ffi_register_kernel",
            "rodas_ffi_launch_count", "rodas_ffi_driver_status")


class FfiBuildError(CudaBackendUnavailable):
    """The FFI handler library cannot be built or loaded here."""


class _Process:
    """The handler library this process has loaded (None before the first load), the FFI
    targets it has registered, and the key counter of its kernel table."""

    def __init__(self):
        self.lock = threading.RLock()
        self.library = None
        self.library_path = None
        self.targets: set = set()
        self.kernel_keys = itertools.count(1)


_PROCESS = _Process()


class FfiLibrary:
    """Where the handler library comes from and how to build it.

    build_dir: directory of the built ``.so`` (created on first use). prebuilt: a library built
    elsewhere, used as it is (no compiler needed). cxx: the C++ compiler (name on PATH or path).
    source: the handler's C++ source (tests build broken sources through it).
    """

    def __init__(self, build_dir: Path | str, *, prebuilt: Path | str | None = None,
                 cxx: str = "g++", source: Path | str = SOURCE):
        self.build_dir = Path(build_dir)
        self.prebuilt = Path(prebuilt) if prebuilt is not None else None
        self.cxx = cxx
        self.source = Path(source)

    def digest(self) -> str:
        import jax
        import jaxlib

        h = hashlib.sha256()
        h.update(self.source.read_bytes())
        h.update(f"jax={jax.__version__};jaxlib={jaxlib.__version__};flags={CXX_FLAGS}".encode())
        return h.hexdigest()[:20]

    def _compiler(self) -> str:
        path = shutil.which(self.cxx)
        if path is None:
            raise FfiBuildError(
                f"the CUDA backend's JAX interop needs a C++ compiler to build its XLA FFI "
                f"handler (solver/backends/cuda/csrc/rodas_ffi.cc), but {self.cxx!r} was not "
                "found on PATH. Install g++ (e.g. apt-get install g++), name another compiler "
                "(cxx=...), or build the library on another x86_64 Linux machine with "
                "FfiLibrary(build_dir=DIR).build() and pass the .so it writes as the prebuilt "
                "library.")
        return path

    def build(self, out: Path | str | None = None) -> Path:
        """Compile the handler; returns the shared object's path."""
        import jax.ffi

        out = Path(out) if out is not None else self.build_dir / f"rodas_ffi_{self.digest()}.so"
        cxx = self._compiler()
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        cmd = [cxx, *CXX_FLAGS, "-isystem", jax.ffi.include_dir(), str(self.source), "-o",
               str(tmp), "-ldl"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:
            raise FfiBuildError(f"running the C++ compiler failed: {' '.join(cmd)}: {exc}") \
                from exc
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise FfiBuildError(
                f"building the XLA FFI handler failed (exit {proc.returncode}):\n  "
                f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        os.replace(tmp, out)
        return out

    def path(self, build: bool = True) -> Path:
        """The prebuilt library if given, else the build for this source and jax (built if
        missing and ``build``)."""
        if self.prebuilt is not None:
            if not self.prebuilt.is_file():
                raise FfiBuildError(f"the prebuilt FFI library {self.prebuilt} is not a file")
            return self.prebuilt
        p = self.build_dir / f"rodas_ffi_{self.digest()}.so"
        if not p.is_file():
            if not build:
                raise FfiBuildError(f"{p} not built yet")
            self.build(p)
        return p

    def load(self):
        """The process's handler library (ctypes): the one already loaded, else this one,
        built on first use."""
        with _PROCESS.lock:
            if _PROCESS.library is not None:
                return _PROCESS.library
            path = self.path()
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise FfiBuildError(f"loading the FFI handler library {path} failed: {exc}") \
                    from exc
            for sym in _SYMBOLS:
                if not hasattr(lib, sym):
                    raise FfiBuildError(f"{path} does not export {sym}: stale or foreign library")
            lib.rodas_ffi_abi_version.restype = ctypes.c_int
            if lib.rodas_ffi_abi_version() != ABI_VERSION:
                raise FfiBuildError(f"{path} has C ABI version {lib.rodas_ffi_abi_version()}, "
                                    f"this module needs {ABI_VERSION}: rebuild it")
            lib.rodas_ffi_register_kernel.argtypes = [ctypes.c_int64, ctypes.c_char_p,
                                                      ctypes.c_size_t, ctypes.c_char_p]
            lib.rodas_ffi_register_kernel.restype = ctypes.c_int
            lib.rodas_ffi_launch_count.restype = ctypes.c_longlong
            lib.rodas_ffi_driver_status.restype = ctypes.c_char_p
            _PROCESS.library, _PROCESS.library_path = lib, path
            return lib

    def loaded_path(self) -> Path | None:
        """The path of the handler library this process loaded (None before the first load)."""
        return _PROCESS.library_path

    def register_target(self, probe: bool = False) -> str:
        """Register the handler (or its CPU packing twin) with XLA; returns the target name."""
        import jax

        name = PROBE_TARGET_NAME if probe else TARGET_NAME
        with _PROCESS.lock:
            if name not in _PROCESS.targets:
                lib = self.load()
                fn = getattr(lib, PROBE_SYMBOL if probe else HANDLER_SYMBOL)
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn),
                                            platform="cpu" if probe else "CUDA")
                _PROCESS.targets.add(name)
        return name

    def register_kernel(self, image: bytes, func_name: str) -> int:
        """Hand a kernel image and its entry name to the handler; returns its key."""
        key = next(_PROCESS.kernel_keys)
        self.load().rodas_ffi_register_kernel(key, image, len(image), func_name.encode())
        return key

    def launch_count(self) -> int:
        """Kernel launches the CUDA handler has made in this process."""
        return int(self.load().rodas_ffi_launch_count())

    def driver_status(self) -> str:
        """The handler's view of the CUDA driver: "" when usable, else why not."""
        return self.load().rodas_ffi_driver_status().decode()
