"""Large jitted programs whose traced form is kept on disk, so a later process does not trace them.

JAX's persistent compilation cache keeps compiled executables between processes, but every
process still traces the Python function and lowers it to StableHLO before the cache can be
consulted. For the few large programs of a run (the JAX backend's ensemble solve, the boltzmann
tables) that is seconds of a second run that computes for about one. :class:`PersistedProgram`
stores the traced program with ``jax.export`` instead: a later process deserializes it and runs
``jax.jit(exported.call)``, whose lowering is cheap, and the XLA cache then supplies the
executable.

Nothing is persisted unless a store directory is set (:func:`set_program_store`; the entry
points do it through ``boltzmann.runtime.configure``): the library sets no global state at import.
An entry's key covers everything that could change the traced program -- the caller's key parts
(fingerprints of the functions traced, sizes, options), a digest of this project's source, the
JAX and jaxlib versions, the platform and the arguments' abstract signature -- so a stale entry is
never loaded; a file whose checksum does not match (truncated, overwritten) is deleted and
rebuilt. Anything that cannot be keyed or exported (a tracer argument, an unfingerprintable
function, a host callback) falls back to plain ``jax.jit``, silently: persistence only saves time.

A stored program carries no MLIR locations (``_without_locations``). XLA turns every location into
per-instruction metadata (the op's name path and Python source line), which the compiled
executable keeps: for the P(k) Jacobian's solve program, 350k instructions after fusion, it
makes up about half of a 74-MB XLA:CPU cache entry, and XLA:CPU rebuilds the whole instruction
list from the entry whenever a later process loads it.
"""
from __future__ import annotations

import dataclasses
import gc
import hashlib
import logging
import threading
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import numpy as np

from .files import atomic_write

__all__ = ["PersistedProgram", "set_program_store", "program_store", "code_digest", "STATS",
           "SUFFIX"]

log = logging.getLogger(__name__)

#: file name suffix of a stored program
SUFFIX = ".jaxexport"
#: first line of a stored program; the second is the sha256 (hex) of the payload after it
MAGIC = b"persisted-jax-export-1\n"
#: packages whose source is hashed into every key (any edit of them invalidates every entry)
CODE_PACKAGES = ("solver", "models", "boltzmann")
#: process-wide counts: programs exported and written, loaded from the store, run by plain jit
#: (no store, a tracer argument, no key, a failed export), entries found corrupt and deleted
STATS = {"exported": 0, "loaded": 0, "plain": 0, "corrupt": 0}

_store: Path | None = None
_code_digest: str | None = None


def set_program_store(directory) -> None:
    """Keep persisted programs under ``directory`` (created when first written); None: persist
    nothing (the default), every program is then plain ``jax.jit``."""
    global _store
    _store = None if directory is None else Path(directory).expanduser()


def program_store() -> Path | None:
    """The directory set by :func:`set_program_store` (None: none)."""
    return _store


def code_digest() -> str:
    """sha256 over every .py file of ``CODE_PACKAGES`` (relative path and content), read once per
    process: the traced programs are built by this code, so an edit anywhere invalidates them
    (coarse, but a stale program would be a silent wrong answer)."""
    global _code_digest
    if _code_digest is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for package in CODE_PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                h.update(str(path.relative_to(root)).encode() + b"\x00")
                h.update(path.read_bytes() + b"\x01")
        _code_digest = h.hexdigest()
    return _code_digest


def _platform(leaves) -> str:
    """The platform the program will run on, in ``jax.export``'s names: that of committed array
    arguments, else the default device's (``jax.default_device`` context included), else the
    default backend."""
    platforms = {d.platform for x in leaves if isinstance(x, jax.Array)
                 and getattr(x, "committed", False) for d in x.devices()}
    dev = jax.config.jax_default_device
    if len(platforms) == 1:
        name = platforms.pop()
    elif isinstance(dev, str):
        name = dev
    elif dev is not None and hasattr(dev, "platform"):
        name = dev.platform
    else:
        name = jax.default_backend()
    return export_platform_name(name, _gpu_platform_version() if name == "gpu" else "")


def export_platform_name(platform: str, platform_version: str = "") -> str:
    """``jax.export``'s name of a device platform: devices call every GPU "gpu", while an exported
    program names its target "cuda" or "rocm" and refuses to run on "gpu" under any other name."""
    if platform != "gpu":
        return platform
    return "rocm" if "rocm" in platform_version.lower() else "cuda"


def _gpu_platform_version() -> str:
    try:
        return str(jax.devices("gpu")[0].client.platform_version)
    except (RuntimeError, AttributeError, IndexError):
        return ""


def _signature(leaves, treedef):
    """(hashable signature, abstract leaves) of the flattened arguments, or None when an argument
    is not a plain single-device value (then the program runs by plain jit)."""
    tree = str(treedef)
    if " at 0x" in tree:      # an aux datum printed by id: not stable between processes
        return None
    avals, parts = [], [tree]
    for x in leaves:
        if isinstance(x, jax.Array) and len(x.devices()) != 1:
            return None
        try:
            aval = jax.typeof(x)
            shape, dtype, weak = tuple(aval.shape), np.dtype(aval.dtype), bool(aval.weak_type)
        except Exception:  # noqa: BLE001 - anything jit would treat specially
            return None
        avals.append(jax.ShapeDtypeStruct(shape, dtype, weak_type=weak))
        parts.append(f"{shape}:{dtype.str}:{int(weak)}")
    return "|".join(parts), avals


def _read_entry(path: Path):
    """The payload of a stored program, or None when there is none or it is corrupt (then
    deleted, so that it is rebuilt)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(MAGIC) + 65
    if (len(data) > head and data.startswith(MAGIC) and data[head - 1:head] == b"\n"
            and hashlib.sha256(data[head:]).hexdigest().encode() == data[len(MAGIC):head - 1]):
        return data[head:]
    log.debug("persisted program %s is corrupt: deleted", path.name)
    STATS["corrupt"] += 1
    path.unlink(missing_ok=True)
    return None


def _without_locations(exported):
    """``exported`` with its module's locations replaced by unknown ones (MLIR's strip-debuginfo
    pass), or unchanged where this JAX lacks the internals used (a persisted program then only
    keeps its metadata). JAX's compilation-cache key ignores locations, so both forms share XLA
    cache entries."""
    try:
        from jax._src.export._export import _module_to_bytecode
        from jax._src.interpreters import mlir
        from jax._src.lib import _jax
        from jax._src.lib.mlir import passmanager

        with mlir.make_ir_context():
            module = _jax.mlir.deserialize_portable_artifact(exported.mlir_module_serialized)
            passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(module.operation)
            serialized = _module_to_bytecode(module)
        return dataclasses.replace(exported, mlir_module_serialized=serialized)
    except Exception as exc:  # noqa: BLE001 - private JAX internals: keep the program as it is
        log.debug("locations not stripped (%s: %s)", type(exc).__name__, exc)
        return exported


def _write_entry(path: Path, payload: bytes) -> None:
    """The payload behind its magic line and checksum, written atomically."""
    atomic_write(path, MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


class _Site(NamedTuple):
    """Where one signature's program lives: its slot in ``PersistedProgram._programs`` (store,
    platform, signature), its file (None: the function has no key), the flat argument leaves as
    given, their tree and their abstract values."""

    slot: tuple
    path: Path | None
    leaves: list
    treedef: object
    avals: list


class PersistedProgram:
    """``jax.jit(fn)``, with its traced form persisted in the program store.

    key_parts: what identifies ``fn`` beyond the project's code and the arguments' signature
    (strings, numbers, bytes; fingerprints of the functions it traces), or a callable returning
    them, evaluated once on first need (it may raise: the program is then never persisted).
    ``fn``'s outputs must be serializable pytrees for ``jax.export`` (tuples, lists, dicts, None,
    namedtuples registered with ``jax.export.register_namedtuple_serialization``); otherwise
    the program runs by plain jit.
    """

    def __init__(self, fn: Callable, key_parts, name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "program")
        self._key_parts = key_parts
        self._parts_digest: str | None = None
        self._keyable = True
        self._jit = jax.jit(fn)
        #: (store, signature) -> the callable taking the flat argument leaves: a loaded
        #: executable (``load``) or the jit of a stored program
        self._programs: dict = {}
        #: held while a program is found, loaded or built, so that a background ``load`` and a
        #: call from another thread never do the same work twice
        self._lock = threading.RLock()

    def __call__(self, *args):
        program, leaves = self._program_for(args)
        if program is self._jit:
            return self._jit(*args)
        return program(*leaves)

    def stored_output_shapes(self, *args):
        """The outputs' shapes and dtypes (a pytree of ``jax.ShapeDtypeStruct``) of the program
        stored for arguments like ``args`` (values or shape structs), read from the store without
        tracing or compiling anything; None when none is stored. The deserialised program is
        kept for the call that follows."""
        with self._lock:
            site = self._site(args)
            exported = None if site is None else self._read_exported(site.path)
            if exported is None:
                return None
            self._programs.setdefault(site.slot, jax.jit(exported.call))
            return jax.tree_util.tree_unflatten(exported.out_tree, [
                jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
                for a in exported.out_avals])

    def has_stored(self, *args) -> bool:
        """Whether the store holds a program for arguments like ``args`` (values or shape
        structs): its file exists (not read, so not checked)."""
        site = self._site(args)
        return site is not None and site.path is not None and site.path.is_file()

    def load(self, *args, build: bool = False) -> bool:
        """Make the program for arguments like ``args`` (values, or shape structs with the
        sharding of the values it will be called with) ready to run -- deserialised from the
        store and its executable loaded from XLA's cache -- without running it; False, having
        done nothing, when the store has no such program. With ``build``, a program the store
        lacks is traced, exported, stored and compiled instead (False only where it cannot be
        persisted: then the call compiles it by plain jit).

        For a background thread: a later process can load the largest program while it computes
        something else (``boltzmann.gradients.PowerSpectrumFunction.preload``). ``build`` is
        for a first process whose machine has memory to spare beside the caller's own work (a
        GPU machine's host): compiling adds the compile's memory to the caller's peak."""
        with self._lock:
            site = self._site(args)
            if site is None:
                return False
            if isinstance(self._programs.get(site.slot), jax.stages.Compiled):
                return True
            exported = self._read_exported(site.path)
            if exported is not None:
                program = jax.jit(exported.call)
            elif build and site.path is not None:
                program = self._build(site)
                if program is self._jit:
                    self._programs[site.slot] = program
                    return False
            else:
                return False
            # lowered from the leaves as given: their shardings are part of XLA's cache key,
            # so shape structs must carry those of the arrays the program will be called with
            self._programs[site.slot] = program.lower(*site.leaves).compile()
            return True

    def release(self) -> None:
        """Drop this program's compiled and deserialised forms, and with them every jit cache of
        the process (``jax.clear_caches``: XLA keeps a loaded executable for as long as any cache
        refers to it). The next call loads or compiles again; a process that will not call
        again frees the memory for what it compiles next."""
        with self._lock:
            self._programs.clear()
            jax.clear_caches()
        gc.collect()

    def lower(self, *args):
        """The plain ``jax.jit`` lowering for arguments like ``args`` (values or shape structs),
        bypassing the store: what measuring the program's size and compile cost needs."""
        return self._jit.lower(*args)

    def prepare(self, *args) -> str:
        """Find or build the program for arguments like ``args`` without running it: "loaded"
        (from the store), "exported" (traced now and stored), "kept" (this object built it
        before) or "plain" (plain jit: no store, tracers, an unkeyable function or a failed
        export)."""
        before = dict(STATS)
        program, _ = self._program_for(args)
        if program is self._jit:
            return "plain"
        return "loaded" if STATS["loaded"] > before["loaded"] else "exported" \
            if STATS["exported"] > before["exported"] else "kept"

    def _program_for(self, args):
        """(the callable for ``args``' signature — ``self._jit`` when not persisted —, the flat
        argument leaves)."""
        if _store is None:
            return self._jit, jax.tree_util.tree_leaves(args)
        site = self._site(args)
        if site is None:
            STATS["plain"] += 1
            return self._jit, jax.tree_util.tree_leaves(args)
        with self._lock:
            program = self._programs.get(site.slot)
            if program is None:
                program = self._build(site)
                self._programs[site.slot] = program
        return program, site.leaves

    def _site(self, args) -> _Site | None:
        """Where the program for ``args`` lives in the store, or None where nothing can be
        persisted (no store, a tracer argument, an argument jit treats specially)."""
        store = _store
        leaves, treedef = jax.tree_util.tree_flatten(args)
        if store is None or any(isinstance(x, jax.core.Tracer) for x in leaves):
            return None
        sig = _signature(leaves, treedef)
        if sig is None:
            return None
        platform = _platform(leaves)
        key = self.key(platform, sig[0])
        return _Site(slot=(str(store), platform, sig[0]),
                     path=None if key is None else store / f"{key}{SUFFIX}",
                     leaves=leaves, treedef=treedef, avals=sig[1])

    def _read_exported(self, path: Path | None):
        """The program stored at ``path``, or None (no key, nothing stored, or an entry that is
        corrupt or written by an incompatible jaxlib: then deleted, so that it is rebuilt)."""
        payload = None if path is None else _read_entry(path)
        if payload is None:
            return None
        try:
            exported = jax.export.deserialize(payload)
        except Exception as exc:  # noqa: BLE001 - e.g. written by an incompatible jaxlib
            log.debug("%s: %s does not deserialize (%s): deleted", self.name, path.name, exc)
            STATS["corrupt"] += 1
            path.unlink(missing_ok=True)
            return None
        STATS["loaded"] += 1
        log.debug("%s: loaded %s", self.name, path.name)
        return exported

    def clear(self) -> None:
        """Forget the loaded programs (a later call reads the store again)."""
        with self._lock:
            self._programs.clear()

    def _digest_of_parts(self):
        if self._parts_digest is None and self._keyable:
            try:
                parts = self._key_parts() if callable(self._key_parts) else self._key_parts
                h = hashlib.sha256()
                for part in parts:
                    h.update(repr(part).encode() + b"\x00")
                self._parts_digest = h.hexdigest()
            except Exception as exc:  # noqa: BLE001 - e.g. Unfingerprintable: not persisted
                log.debug("%s: no key (%s: %s), plain jit", self.name, type(exc).__name__, exc)
                self._keyable = False
        return self._parts_digest

    def key(self, platform: str, signature: str) -> str | None:
        """The store key of this program for one platform and argument signature."""
        parts = self._digest_of_parts()
        if parts is None:
            return None
        import jaxlib
        h = hashlib.sha256()
        for item in (parts, code_digest(), jax.__version__, jaxlib.__version__, platform,
                     bool(jax.config.jax_enable_x64), str(jax.config.jax_default_matmul_precision),
                     signature):
            h.update(str(item).encode() + b"\x00")
        return h.hexdigest()

    def _build(self, site: _Site):
        """The callable for one signature: loaded from the store, else exported and written;
        plain jit (``self._jit``) if that fails."""
        if site.path is None:
            STATS["plain"] += 1
            return self._jit
        exported = self._read_exported(site.path)
        if exported is not None:
            return jax.jit(exported.call)
        fn, treedef, platform, path = self.fn, site.treedef, site.slot[1], site.path

        def flat(*leaves):
            return fn(*jax.tree_util.tree_unflatten(treedef, leaves))

        try:
            exported = jax.export.export(jax.jit(flat), platforms=[platform])(*site.avals)
            payload = bytes(_without_locations(exported).serialize())
            # what a later process runs: the program as read back, so both share XLA entries
            exported = jax.export.deserialize(payload)
        except Exception as exc:  # noqa: BLE001 - unsupported primitive, callback, output tree
            log.debug("%s: not exported (%s: %s), plain jit", self.name, type(exc).__name__, exc)
            STATS["plain"] += 1
            return self._jit
        try:
            _write_entry(path, payload)
        except OSError as exc:          # a read-only or full disk: run it, store nothing
            log.debug("%s: %s not written (%s)", self.name, path.name, exc)
        STATS["exported"] += 1
        return jax.jit(exported.call)
