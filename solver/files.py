"""Writing the persistent caches' files so that concurrent processes never see half of one.

The kernel cache, the generated kernel modules and the persisted JAX programs are shared by every
process of a user (a sampler's workers start together and fill the same cache), so each file is
written to a temporary name in its own folder and renamed into place: a reader sees the old file,
none, or the whole new one.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file in the same folder, then
    ``os.replace``); the folder is created if missing. The file is readable by all, as a file
    written directly would be (``mkstemp`` alone makes it owner-only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
