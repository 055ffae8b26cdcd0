"""Memory a Mooncake dummy client shares with the store client (storage/relay/mooncake.py).

A dummy client's transfers must start or end in memory the store client maps: memory from
the client's `alloc_from_mem_pool`, registered once with its exact base and size (a plain
buffer is refused with -600; part of an allocation too). Mooncake has no call to give such
memory back, so a `PoolBuffer` grows only: to the largest transfer asked of it, at least
`min_bytes` from the start, and is released with the client.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from storage.relay.base import RelayError


class PoolBuffer:
    """One registered allocation of a dummy client's shared memory, grown on demand."""

    def __init__(self, store, min_bytes: int) -> None:
        if min_bytes <= 0:
            raise ValueError(f"a pool buffer needs min_bytes > 0, got {min_bytes}")
        self._store, self.min_bytes = store, min_bytes
        self._ptr, self._array = 0, np.empty(0, dtype=np.uint8)

    def at_least(self, nbytes: int) -> np.ndarray:
        """The whole buffer as uint8, `nbytes` or more (the caller holds the relay's lock)."""
        if nbytes > self._array.nbytes:
            self.release()
            size = max(nbytes, self.min_bytes)
            ptr = self._store.alloc_from_mem_pool(size)
            if not ptr:
                raise RelayError(f"mooncake relay: the store client gave no {size} bytes of "
                                 "shared memory")
            if self._store.register_buffer(ptr, size) != 0:
                raise RelayError(f"mooncake relay: cannot register {size} bytes of shared "
                                 "memory with the store client")
            self._ptr = ptr
            self._array = np.frombuffer((ctypes.c_ubyte * size).from_address(ptr),
                                        dtype=np.uint8)
        return self._array

    @property
    def address(self) -> int:
        return self._ptr

    def release(self) -> None:
        """Unregister (the memory itself stays mapped until the client closes)."""
        if self._ptr:
            self._store.unregister_buffer(self._ptr)
            self._ptr, self._array = 0, np.empty(0, dtype=np.uint8)


def put_shared(store, pool: PoolBuffer, key: str, value: memoryview, config) -> int:
    """upsert `value` through `pool`: one copy into shared memory, the store client copies it
    into its segment; the return code."""
    pool.at_least(value.nbytes)[:value.nbytes] = np.frombuffer(value, dtype=np.uint8)
    return store.upsert_from(key, pool.address, value.nbytes, config)


def read_shared(store, pool: PoolBuffer, keys: Sequence[str], sizes: list[int],
                offsets: list[int], out: np.ndarray) -> list[int]:
    """The values of `keys` (`sizes`, at `offsets` in `out`) through `pool` into `out`, as
    many per batch as fit it (it grows to the largest value); their return codes."""
    room = pool.at_least(max(sizes)).nbytes
    rcs: list[int] = []
    first = 0
    while first < len(keys):
        last = first + 1
        while last < len(keys) and offsets[last + 1] - offsets[first] <= room:
            last += 1
        start = offsets[first]
        rcs += store.batch_get_into(list(keys[first:last]),
                                    [pool.address + o - start for o in offsets[first:last]],
                                    sizes[first:last])
        out[start:offsets[last]] = pool.at_least(0)[:offsets[last] - start]
        first = last
    return rcs


def read_slots(store, address: int, area: np.ndarray, keys: Sequence[str],
               limits: Sequence[int]) -> list[memoryview | None]:
    """The values of `keys` read in one batch into slots of `limits` bytes laid end to end
    in `area` (registered memory at `address`, at least sum(limits) long), then copied out of
    it (the area is reused) into one array of their actual sizes: writable views the caller
    owns, None for a key absent, larger than its slot, or failed (the caller reads it again
    the usual way, which says why)."""
    offsets = np.concatenate([[0], np.cumsum(limits)]).tolist()
    rcs = store.batch_get_into(list(keys), [address + o for o in offsets[:-1]], list(limits))
    size = sum(_aligned(rc) for rc in rcs if rc > 0)
    out = np.empty(size + 64, dtype=np.uint8)
    out = out[-out.ctypes.data % 64:][:size]  # starting on a 64-byte boundary
    values: list[memoryview | None] = []
    at = 0
    for rc, start in zip(rcs, offsets):
        if rc <= 0:
            values.append(None)
            continue
        out[at:at + rc] = area[start:start + rc]
        values.append(memoryview(out[at:at + rc]))
        at += _aligned(rc)  # each value 64-byte aligned, as its own allocation would be
    return values


def _aligned(n: int) -> int:
    return -(-n // 64) * 64
