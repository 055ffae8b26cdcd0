"""The relay over Mooncake Store (mooncake-transfer-engine-non-cuda, TCP on 127.0.0.1).

Mooncake pitfalls handled here:
- `put` on an existing key keeps the OLD value: every write is an `upsert`.
- Objects are evicted silently when segments fill: every write is hard-pinned (a full store
  then fails the put with -200, reported as RelayError), and old versions are removed by the
  publisher.
- `get` of a missing key returns b'' (also when the master is down): reads go through
  get_size / get_into, whose codes tell "missing" (-704) from "unreachable" (-900).
- A key whose put is under way answers -703 (REPLICA_IS_NOT_READY) to readers: waited for
  briefly, then reported missing (not published yet), never as a relay failure.
- An object lives in the segment of one client: writes prefer this client's own segment, so
  what a publisher pushes lives exactly as long as the publisher. Pure readers can mount no
  segment (segment_bytes=0). A master restart loses every object.
- With `client_addr` (the stack's store client, rose/stack/mooncake.py) it is a "dummy" client
  of it: objects live in its segment while it runs, and every transfer is copied through
  memory shared with it (storage/relay/mooncake_pool.py), not sent over TCP (bench/transfer/relay.py).
  A store client that dies takes its values with it, and no reconnect mends its clients:
  their ops fail at once saying so (a TCP probe of it), rather than wait for a reconnect.
- Plain put/get copy through `local_buffer_size`; payloads of zero_copy_min_bytes or more go
  zero-copy (register_buffer + upsert_from / get_into), about 2-3x faster for 64 MB buckets.
  Registering and unregistering a buffer costs ~0.6-0.8 ms whatever its size, so a batch
  read of up to `staging_bytes` (4 MB) lands in one buffer registered once per client and is
  copied out: 2.3x faster for 100 KB, 1.29x for 1.7 MB (a small policy's bucket), 1.15x for
  4 MB; past ~8 MB the copy costs what registering saves (bench/transfer/relay_small_reads.py,
  results/relay_small_reads.json).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from storage.relay.mooncake_client import answers as _answers, open_store, reconnected
from storage.relay.mooncake_pool import PoolBuffer, put_shared, read_shared, read_slots
from storage.relay.base import Buffer, Relay, RelayError, RelayKeyMissing, check_key, check_prefix, check_value

_CODES = {-10: "BUFFER_OVERFLOW",
          -200: "NO_AVAILABLE_HANDLE (full of pinned objects: raise segment_bytes, stack.relay_store_mb)",
          -600: "INVALID_PARAMS", -703: "REPLICA_IS_NOT_READY", -704: "OBJECT_NOT_FOUND", -706: "OBJECT_HAS_LEASE",
          -800: "TRANSFER_FAIL (the segment's owner may have died)"}
_MISSING, _NOT_READY = -704, -703  # REPLICA_IS_NOT_READY: a put of the key is under way
_NOT_READY_WAIT_S = 2.0  # how long a reader waits for such a put before calling the key missing
_RPC_FAIL, _RECONNECT_WAIT_S = -900, 8.0  # a store client reconnects to a new master in ~2-4 s
# how long an op waits for a dead master to answer again: the stack's supervisor restarts it
# within ~1-2 s (rose/stack/supervisor.py; set by rose.stack.mooncake.mooncake_env); 0 (no
# supervisor): the op fails at once
RESTART_WAIT_ENV = "ROSE_MOONCAKE_RESTART_WAIT_S"
SUPERVISOR_ENV = "ROSE_STACK_SUPERVISOR_PID"  # the pid of the stack's supervisor, when there is one
PROBE_EVERY_S = 0.05  # a master or store client dead for less is told by the RPC (its ~4 s timeout)


def _addr(buf: np.ndarray | memoryview) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


class MooncakeRelay(Relay):
    """A Mooncake Store client used as a relay; see the module docstring for the rules."""

    name = "mooncake"

    def __init__(self, master_addr: str, metadata_url: str, segment_bytes: int = 1 << 30,
                 local_buffer_bytes: int = 64 << 20, zero_copy_min_bytes: int = 1 << 20,
                 staging_bytes: int = 4 << 20, client_addr: str | None = None):
        if segment_bytes < 0 or local_buffer_bytes <= 0 or staging_bytes < 0:
            raise ValueError("segment_bytes and staging_bytes must be >= 0 and "
                             "local_buffer_bytes > 0")
        self.master_addr, self.metadata_url = master_addr, metadata_url
        self.zero_copy_min_bytes = zero_copy_min_bytes
        self.staging_bytes = staging_bytes
        self._staging: np.ndarray | None = None  # registered at the first small batch read
        self._lock = threading.Lock()  # register/transfer/unregister must not interleave
        self._store = None
        self._probed_until = 0.0  # monotonic time until which the master is taken as alive
        if not self._master_answers():  # fail in milliseconds, not after setup's ~4 s
            raise RelayError(f"mooncake relay: master at {master_addr} does not answer")
        store = open_store(master_addr, metadata_url, segment_bytes, local_buffer_bytes,
                           client_addr)
        from mooncake.store import ReplicateConfig  # open_store imported the package

        self._store, self.client_addr = store, client_addr
        # a dummy client's transfers start and end in memory shared with the store client
        self._shared = None if not client_addr else \
            (PoolBuffer(store, local_buffer_bytes), PoolBuffer(store, local_buffer_bytes))
        self._config = ReplicateConfig()
        self._config.replica_num = 1
        self._config.with_hard_pin = True  # never evicted behind our back
        if segment_bytes > 0 and not client_addr:
            self._config.preferred_segment = store.get_hostname()

    # -- helpers ------------------------------------------------------------------------
    def _master_answers(self) -> bool:
        return _answers(self.master_addr)

    def _master_back(self) -> bool:
        """Whether the master answers, now or within the restart window the stack gives
        (RESTART_WAIT_ENV: its supervisor restarts a master that died), while that supervisor
        lives (SUPERVISOR_ENV: after `rose down` nothing will restart it)."""
        deadline = time.monotonic() + restart_wait_s()
        while not self._master_answers():
            if time.monotonic() >= deadline or not _supervised():
                return False
            time.sleep(0.1)
        return True

    def _check_store_client(self, op: str, key: str) -> None:
        """RelayError at once where the stack's store client is gone: no wait mends that, so
        waiting out _RECONNECT_WAIT_S would only delay the error."""
        if self.client_addr and not _answers(self.client_addr):
            raise RelayError(f"mooncake relay: {op} {key!r} failed: the store client at "
                             f"{self.client_addr} is gone, and the values it held with it "
                             "(`rose status`; `rose up`, or `rose resume` of the run, starts "
                             "a new stack)")

    def _worth_waiting(self, op: str, key: str) -> bool:
        """A dummy client failing: whether its store client may be reconnecting to a master
        that answers again."""
        self._check_store_client(op, key)
        return bool(self.client_addr) and self._master_back()

    def _live(self, op: str, key: str, probe: bool = False):
        """The store, if open and its master answers. health_check is instant but lags a dead
        master by a heartbeat; `probe` (a TCP connect, ~0.1 ms on loopback) does not, and
        saves a metadata RPC's ~4 s timeout on ops whose failure cannot be told otherwise.
        A store client reconnecting to a master that answers again is waited for."""
        if (store := self._store) is None:
            raise RelayError(f"mooncake relay: {op} {key!r} on a closed relay")
        healthy = store.health_check() == 0 or (self._worth_waiting(op, key)
                                                 and reconnected(store, _RECONNECT_WAIT_S))
        if not healthy or (probe and not self._probe(op, key)):
            raise RelayError(f"mooncake relay: {op} {key!r} failed: master at "
                             f"{self.master_addr} unreachable")
        return store

    def _probe(self, op: str, key: str) -> bool:
        """_master_answers (and the store client is there), at most once per PROBE_EVERY_S: a
        receiver polling the relay every millisecond would otherwise connect on every poll."""
        now = time.monotonic()
        if now < self._probed_until:
            return True
        self._check_store_client(op, key)
        answers = self._master_answers() or (bool(self.client_addr) and self._master_back()
                                             and reconnected(self._store, _RECONNECT_WAIT_S))
        self._probed_until = now + PROBE_EVERY_S if answers else 0.0
        return answers

    def _fail(self, op: str, key: str, rc: int) -> RelayError:
        if rc == _RPC_FAIL:
            self._check_store_client(op, key)  # the RPC went to it, and may have found it gone
            return RelayError(f"mooncake relay: {op} {key!r} failed: master at {self.master_addr} "
                              "unreachable (-900 RPC_FAIL)")
        return RelayError(f"mooncake relay: {op} {key!r} failed with {rc} "
                          f"{_CODES.get(rc, '')}".rstrip())

    # -- Relay ----------------------------------------------------------------------------
    def put(self, key: str, data: Buffer) -> None:
        view = check_value(check_key(key), data)
        store = self._live("put", key, probe=True)
        if self._shared and view.nbytes >= self.zero_copy_min_bytes:
            with self._lock:
                rc = put_shared(store, self._shared[0], key, view, self._config)
        elif view.nbytes >= self.zero_copy_min_bytes:
            with self._lock:
                ptr = _addr(view)
                if store.register_buffer(ptr, view.nbytes) != 0:
                    raise RelayError(f"mooncake relay: cannot register {view.nbytes} bytes for "
                                     f"put {key!r}")
                try:
                    rc = store.upsert_from(key, ptr, view.nbytes, self._config)
                finally:
                    store.unregister_buffer(ptr)
        else:
            rc = store.upsert(key, view, self._config)
        if rc != 0:
            raise self._fail("put", key, rc)

    def _size(self, store, key: str) -> int:
        """The value's size; a put under way is waited for, then the key reads as missing; so is a
        store client reconnecting to a restarted master (-900 for a few seconds)."""
        t0 = time.monotonic()
        size = store.get_size(check_key(key))
        while (size == _NOT_READY and time.monotonic() - t0 < _NOT_READY_WAIT_S) or (
                size == _RPC_FAIL and self._worth_waiting("get", key)
                and time.monotonic() - t0 < _RECONNECT_WAIT_S):
            time.sleep(0.01)
            size = store.get_size(key)
        if size == _MISSING:
            raise RelayKeyMissing(f"{key!r} is not in the mooncake relay at {self.master_addr}")
        if size == _NOT_READY:
            raise RelayKeyMissing(f"{key!r} is still being written to the mooncake relay at "
                                  f"{self.master_addr} after {_NOT_READY_WAIT_S:g} s")
        if size <= 0:
            raise self._fail("get", key, size)
        return size

    def get_many(self, keys: Sequence[str]) -> list[memoryview]:
        """Values of `keys`, fetched in one batch into one buffer (zero copy)."""
        if not keys:
            return []
        store = self._live("get", keys[0], probe=True)
        for _ in range(3):  # a value replaced by a larger one between size and read: retry
            sizes = [self._size(store, key) for key in keys]
            offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
            with self._lock:
                if self._shared:
                    buf = np.empty(offsets[-1], dtype=np.uint8)
                    rcs = read_shared(store, self._shared[1], keys, sizes, offsets, buf)
                elif offsets[-1] <= self.staging_bytes:
                    staging = self._staging_buffer(store)
                    rcs = store.batch_get_into(list(keys), [staging.ctypes.data + o
                                                            for o in offsets[:-1]], sizes)
                    buf = staging[:offsets[-1]].copy()  # the caller's own: the next read reuses
                else:
                    buf = np.empty(offsets[-1], dtype=np.uint8)
                    base = buf.ctypes.data
                    if store.register_buffer(base, buf.nbytes) != 0:
                        raise RelayError(f"mooncake relay: cannot register {buf.nbytes} bytes "
                                         "for get")
                    try:
                        rcs = store.batch_get_into(list(keys), [base + o for o in offsets[:-1]],
                                                   sizes)
                    finally:
                        store.unregister_buffer(base)
            if any(rc in (-600, _NOT_READY) for rc in rcs):  # replaced meanwhile: read again
                continue
            for key, rc, size in zip(keys, rcs, sizes):
                if rc == _MISSING:
                    raise RelayKeyMissing(f"{key!r} was removed from the mooncake relay while "
                                          "being read")
                if rc != size:
                    raise self._fail("get", key, rc)
            view = memoryview(buf)
            return [view[offsets[i]:offsets[i + 1]] for i in range(len(keys))]
        raise RelayError(f"mooncake relay: values of {list(keys)[:3]} kept changing during get")

    def _staging_buffer(self, store) -> np.ndarray:
        """The client's registered buffer for small batch reads (under self._lock)."""
        if self._staging is None:
            staging = np.empty(self.staging_bytes, dtype=np.uint8)
            if store.register_buffer(staging.ctypes.data, staging.nbytes) != 0:
                raise RelayError(f"mooncake relay: cannot register {staging.nbytes} bytes of "
                                 "staging for gets")
            self._staging = staging
        return self._staging

    def get(self, key: str) -> bytes:
        check_key(key)
        store = self._live("get", key, probe=True)
        value = store.get(key)  # one RPC; b'' means missing OR failed (values are never empty)
        if value:
            return value
        self._live("get", key, probe=True)
        self._size(store, key)  # missing, being written, or failed: raises saying which
        return self.get_many([key])[0].tobytes()  # too large for the local buffer

    def get_batch(self, keys: Sequence[str], limits: Sequence[int]
                  ) -> list[memoryview | None] | None:
        if not keys or len(keys) != len(limits) or min(limits) <= 0:
            raise ValueError(f"get_batch: one limit > 0 per key, got {list(limits)[:4]} for "
                             f"{len(keys)} keys")
        keys = [check_key(key) for key in keys]
        store = self._live("get", keys[0], probe=True)
        total = sum(limits)
        with self._lock:  # one RPC into registered memory, as get_many's (no bytes object)
            if self._shared:
                area = self._shared[1].at_least(total)
                return read_slots(store, self._shared[1].address, area, keys, limits)
            if total > self.staging_bytes:
                return None
            staging = self._staging_buffer(store)
            return read_slots(store, staging.ctypes.data, staging, keys, limits)

    def exists(self, key: str) -> bool:
        return self.exists_many([key])[0]

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        for key in keys:
            check_key(key)
        store = self._live("exists", keys[0], probe=True)
        rcs = store.batch_is_exist(list(keys))
        for key, rc in zip(keys, rcs):
            if rc < 0:
                raise self._fail("exists", key, rc)
        return [rc == 1 for rc in rcs]

    def remove(self, key: str) -> bool:
        # force: a reader's lease (10 s after each get) would otherwise block the removal; the
        # publisher only removes superseded versions, and checksums catch a torn read.
        rc = self._live("remove", check_key(key), probe=True).remove(key, True)
        if rc == _MISSING:
            return False
        if rc != 0:
            raise self._fail("remove", key, rc)
        return True

    def remove_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        regex = "^" + prefix.replace(".", "[.]")  # the only regex-special character allowed
        rc = self._live("remove_prefix", prefix, probe=True).remove_by_regex(regex, True)
        if rc < 0:
            raise self._fail("remove_prefix", prefix, rc)
        return rc

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:  # any call on a closed client crashes the process: drop it
            with self._lock:
                if self._staging is not None:
                    store.unregister_buffer(self._staging.ctypes.data)
                    self._staging = None
                for pool in self._shared or ():
                    pool.release()
            store.close()


def restart_wait_s() -> float:
    import os

    try:
        return max(0.0, float(os.environ.get(RESTART_WAIT_ENV, "0")))
    except ValueError:
        return 0.0


def _supervised() -> bool:
    """Whether the stack's supervisor (SUPERVISOR_ENV) still runs; True when none is named."""
    import os

    pid = os.environ.get(SUPERVISOR_ENV, "")
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
