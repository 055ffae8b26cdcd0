"""The one way to write a file atomically: a unique temp file in the same directory, renamed over.

Readers see the old file or the new one, never half of one. The temp name is unique (uuid), so
two writers racing on one path cannot clobber each other's temp file; the last rename wins.
`fsync=True` flushes the data before the rename, for files that must survive a power cut
(trajectories); caches, reports and transfer media skip it.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_PREFIX = ".tmp-"  # temp files start with this: directory scans skip them


def is_temp(name: str) -> bool:
    """Is this file name an atomic write still under way (or left by a crash)?"""
    return name.startswith(TMP_PREFIX)


@contextmanager
def atomic_path(path: str | os.PathLike, *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temp path to write `path`'s new content to (by any writer: pyarrow, torch, ...);
    on a clean exit it replaces `path`, on an error it is removed and `path` is untouched."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}")
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike, data: bytes | bytearray | memoryview | str, *,
                 fsync: bool = False) -> None:
    """Write `data` (text is UTF-8) to `path` atomically."""
    with atomic_path(path, fsync=fsync) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
