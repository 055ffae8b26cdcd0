"""The weight relay: a key -> bytes store that trainers push to and rollout workers pull from.

Contract shared by every implementation:
- keys are plain paths (letters, digits, `_ . - /`); callers version them
  (`rose/<run>/v<version>/...`) so a reader never mixes versions;
- `put` on an existing key REPLACES its value (never keeps the old one silently);
- `get` of an absent key raises RelayKeyMissing (never returns b''); values are non-empty;
- a transport failure raises RelayError whose message names the relay and the operation.
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence

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

    def get_batch(self, keys: Sequence[str], limits: Sequence[int]
                  ) -> list[memoryview | None] | None:
        """Values of a few keys in one round trip, each expected to be at most `limits[i]`
        bytes, as writable views owned by the caller: None for each one absent or larger
        than its limit; None when this relay has no such read (read them one by one then).
        For a guess at what exists, e.g. a version's manifest and first buckets."""
        return None

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        """exists() of several keys; one round trip where the relay can (a waiting receiver
        polls two keys at a time, and on Mooncake each RPC costs ~0.1 ms of CPU)."""
        return [self.exists(k) for k in keys]

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

