"""The filesystem relay: one file per key in a directory (tests, and the stack's fallback when
Mooncake cannot start). Same contract as every relay (storage/relay/base.py)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np

from storage.atomic import is_temp, write_atomic
from storage.relay.base import Buffer, Relay, RelayError, RelayKeyMissing, check_key, check_prefix, check_value


class FilesystemRelay(Relay):
    """One file per key in a flat directory (key quoted, '/' -> %2F), written tmp + rename.

    Flat so that keys `a` and `a/b` can both exist. Writes are atomic for readers (rename);
    they are not fsynced: the relay is a transfer medium, not a checkpoint.
    """

    name = "filesystem"

    def __init__(self, root: Path | str):
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RelayError(f"filesystem relay: cannot create {self.root}: {e.strerror}") from None

    def _path(self, key: str) -> Path:
        return self.root / quote(check_key(key), safe="")

    def put(self, key: str, data: Buffer) -> None:
        view = check_value(key, data)
        try:
            write_atomic(self._path(key), view)
        except OSError as e:
            raise RelayError(f"filesystem relay: put {key!r} into {self.root} failed: "
                             f"{e.strerror or e}") from None

    def _read(self, key: str) -> memoryview:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buf = memoryview(np.empty(size, dtype=np.uint8))  # not zeroed, unlike bytearray
                if f.readinto(buf) != size:
                    raise RelayError(f"filesystem relay: {key!r} changed while being read")
                return buf
        except FileNotFoundError:
            raise RelayKeyMissing(f"{key!r} is not in the filesystem relay at {self.root}") \
                from None
        except OSError as e:
            raise RelayError(f"filesystem relay: get {key!r} failed: {e.strerror or e}") from None

    def get(self, key: str) -> bytes:
        return self._read(key).tobytes()

    def get_many(self, keys: Sequence[str]) -> list[memoryview]:
        return [self._read(k) for k in keys]

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def remove(self, key: str) -> bool:
        try:
            self._path(key).unlink()
            return True
        except FileNotFoundError:
            return False

    def remove_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        removed = 0
        for path in self.root.iterdir():
            if not is_temp(path.name) and unquote(path.name).startswith(prefix):
                path.unlink(missing_ok=True)
                removed += 1
        return removed
