"""The weight relay: a key -> bytes store that trainers push to and rollout workers pull from.

Contract shared by every implementation:
- keys are plain paths (letters, digits, `_ . - /`); callers version them
  (`rose/<run>/v<version>/...`) so a reader never mixes versions;
- `put` on an existing key REPLACES its value (never keeps the old one silently);
- `get` of an absent key raises RelayKeyMissing (never returns b''); values are non-empty;
- a transport failure raises RelayError whose message names the relay and the operation.
"""
from __future__ import annotations

import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np

Buffer = bytes | bytearray | memoryview
_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_./-]+$")


class RelayError(RuntimeError):
    """The relay could not be reached or failed an operation."""


class RelayKeyMissing(KeyError):
    """The key is not in the relay (never written, removed, or lost with its holder)."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "key missing"


def check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key) or ".." in key.split("/"):
        raise ValueError(f"relay key {key!r} must be '/'-separated parts of [A-Za-z0-9_.-]")
    return key


def check_prefix(prefix: str) -> str:
    # Non-empty: an empty prefix would wipe every key of every run in a shared store.
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ValueError(f"relay prefix {prefix!r} must be non-empty [A-Za-z0-9_./-]")
    return prefix


def check_value(key: str, data: Buffer) -> memoryview:
    """`data` as a flat byte view (copied only if not contiguous); refuses empty values."""
    view = memoryview(data)
    if view.nbytes == 0:  # Mooncake refuses empty objects: refuse them everywhere alike
        raise ValueError(f"relay value for {key!r} is empty; relay values must be non-empty")
    return view.cast("B") if view.c_contiguous else memoryview(view.tobytes())


class Relay(ABC):
    """Key -> bytes store; see the module docstring for the contract."""

    name: str = "relay"

    @abstractmethod
    def put(self, key: str, data: Buffer) -> None:
        """Store `data` under `key`, replacing any previous value."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The value under `key`; RelayKeyMissing if absent."""

    def get_many(self, keys: Sequence[str]) -> list[memoryview]:
        """Values of several keys (a pull batch), as writable views owned by the caller."""
        return [memoryview(bytearray(self.get(k))) for k in keys]

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def remove(self, key: str) -> bool:
        """Remove `key`; False if it was not there."""

    @abstractmethod
    def remove_prefix(self, prefix: str) -> int:
        """Remove every key starting with `prefix`; the number removed."""

    def close(self) -> None:
        """Release the client. For Mooncake this drops the objects held in this client's segment."""

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
        path = self._path(key)
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(view)
            os.replace(tmp, path)
        except OSError as e:
            raise RelayError(f"filesystem relay: put {key!r} into {self.root} failed: "
                             f"{e.strerror or e}") from None
        finally:
            tmp.unlink(missing_ok=True)

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
            if not path.name.startswith(".tmp-") and unquote(path.name).startswith(prefix):
                path.unlink(missing_ok=True)
                removed += 1
        return removed


def make_relay(kind: str, root: Path | str | None = None, master_addr: str | None = None,
               metadata_url: str | None = None, segment_bytes: int | None = None,
               local_buffer_bytes: int | None = None) -> Relay:
    """A relay by kind: "filesystem" (needs root) or "mooncake" (addresses default to
    ROSE_MOONCAKE_MASTER / ROSE_MOONCAKE_METADATA)."""
    if kind == "filesystem":
        if root is None:
            raise ValueError("the filesystem relay needs a root directory")
        return FilesystemRelay(root)
    if kind == "mooncake":
        from storage.relay.mooncake import MooncakeRelay  # imports the native client lazily

        master_addr = master_addr or os.environ.get("ROSE_MOONCAKE_MASTER")
        metadata_url = metadata_url or os.environ.get("ROSE_MOONCAKE_METADATA")
        if not master_addr or not metadata_url:
            raise RelayError("mooncake relay: master/metadata address unknown (pass them or set "
                             "ROSE_MOONCAKE_MASTER and ROSE_MOONCAKE_METADATA; `rose up` does)")
        sizes = {k: v for k, v in (("segment_bytes", segment_bytes),
                                   ("local_buffer_bytes", local_buffer_bytes)) if v is not None}
        return MooncakeRelay(master_addr, metadata_url, **sizes)
    raise ValueError(f"unknown relay kind {kind!r} (expected 'mooncake' or 'filesystem')")
