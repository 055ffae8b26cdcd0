"""Relays: the filesystem relay and a real Mooncake Store (master + metadata on 127.0.0.1)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from storage.relay.base import RelayError, RelayKeyMissing
from storage.relay.filesystem import FilesystemRelay
from storage.relay.pool import make_relay

from mooncake_fixtures import (mooncake, mooncake_pair, mooncake_shared_pair, ns, relays,  # noqa: F401 (fixtures)
                               skip_without_mooncake)


def test_round_trip_small_and_large(relays, ns):
    writer, reader = relays
    big = os.urandom(24 << 20)  # above the 16 MB local buffer: goes zero-copy
    writer.put(f"{ns}/small", b"hello")
    writer.put(f"{ns}/big", big)
    writer.put(f"{ns}/view", memoryview(np.arange(6, dtype=np.float32)))
    assert reader.get(f"{ns}/small") == b"hello"
    assert reader.get(f"{ns}/big") == big
    assert np.frombuffer(reader.get(f"{ns}/view"), np.float32).tolist() == [0, 1, 2, 3, 4, 5]
    many = reader.get_many([f"{ns}/big", f"{ns}/small"])
    assert bytes(many[0]) == big and bytes(many[1]) == b"hello"
    many[1][0] = ord("j")  # writable, owned by the caller
    assert reader.get(f"{ns}/small") == b"hello"


def test_missing_key_raises_never_empty(relays, ns):
    writer, reader = relays
    with pytest.raises(RelayKeyMissing, match=f"{ns}/absent"):
        reader.get(f"{ns}/absent")
    with pytest.raises(KeyError):  # KeyError-like
        reader.get_many([f"{ns}/absent"])
    assert not reader.exists(f"{ns}/absent")


def test_put_replaces_existing_value(relays, ns):
    writer, reader = relays
    key = f"{ns}/latest"
    writer.put(key, b"v1")
    writer.put(key, b"version-2-is-longer")  # Mooncake's plain put would keep b"v1"
    assert reader.get(key) == b"version-2-is-longer"
    writer.put(key, b"3")
    assert reader.get(key) == b"3"
    big = os.urandom(2 << 20)
    writer.put(key, big)  # zero-copy path replaces too
    assert reader.get(key) == big


def test_remove_and_remove_prefix(relays, ns):
    writer, reader = relays
    for k in ("v1/bucket-0", "v1/manifest", "v10/bucket-0", "v1x"):
        writer.put(f"{ns}/{k}", b"x")
    writer.put(f"{ns}.v1/bucket-0", b"x")  # '.' in a prefix must not act as a wildcard
    assert writer.remove_prefix(f"{ns}/v1/") == 2
    assert not reader.exists(f"{ns}/v1/bucket-0") and not reader.exists(f"{ns}/v1/manifest")
    assert reader.exists(f"{ns}/v10/bucket-0") and reader.exists(f"{ns}/v1x")
    assert reader.exists(f"{ns}.v1/bucket-0")
    # several keys in one question (one RPC on Mooncake), answered in the keys' order
    assert reader.exists_many([f"{ns}/v1/manifest", f"{ns}/v1x", f"{ns}/v10/bucket-0"]) == \
        [False, True, True]
    assert reader.exists_many([]) == []
    with pytest.raises(ValueError, match="relay key"):
        reader.exists_many([f"{ns}/v1x", "a//b"])
    assert writer.remove(f"{ns}/v1x") is True
    assert writer.remove(f"{ns}/v1x") is False
    with pytest.raises(RelayKeyMissing):
        reader.get(f"{ns}/v1x")
    with pytest.raises(ValueError, match="prefix"):
        writer.remove_prefix("")


def test_bad_keys_and_values_rejected(relays, ns):
    writer, _ = relays
    for key in ("", "/abs", "a//b", "a/../b", "sp ace", "a*b"):
        with pytest.raises(ValueError, match="relay key"):
            writer.put(key, b"x")
    with pytest.raises(ValueError, match="empty"):
        writer.put(f"{ns}/empty", b"")


def test_filesystem_keys_can_nest_and_writes_leave_no_temp(tmp_path):
    relay = FilesystemRelay(tmp_path / "r")
    relay.put("a", b"1")
    relay.put("a/b", b"2")  # a file and a 'directory' of the same name
    assert relay.get("a") == b"1" and relay.get("a/b") == b"2"
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["a", "a%2Fb"]


def test_make_relay_kinds(tmp_path, monkeypatch):
    assert make_relay("filesystem", root=tmp_path).name == "filesystem"
    with pytest.raises(ValueError, match="unknown relay kind"):
        make_relay("carrier-pigeon")
    monkeypatch.delenv("ROSE_MOONCAKE_MASTER", raising=False)
    monkeypatch.delenv("ROSE_MOONCAKE_METADATA", raising=False)
    with pytest.raises(RelayError, match="ROSE_MOONCAKE_MASTER"):
        make_relay("mooncake")


def test_make_relay_reads_mooncake_env(mooncake, monkeypatch):
    from rose.stack.mooncake import mooncake_env

    for k, v in mooncake_env(mooncake).items():
        monkeypatch.setenv(k, v)
    # its own segment: with segment_bytes=0 the put needs space some other test mounted
    with make_relay("mooncake", segment_bytes=16 << 20, local_buffer_bytes=8 << 20) as relay:
        relay.put("t/env", b"ok")
        assert relay.get("t/env") == b"ok" and relay.name == "mooncake"
        relay.remove("t/env")


def test_dead_master_is_one_clear_error(mooncake):
    from rose.stack.ports import free_port
    from storage.relay.mooncake import MooncakeRelay

    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(RelayError, match=f"master at {dead} does not answer"):
        MooncakeRelay(dead, mooncake.metadata_url, segment_bytes=0)


def test_master_gone_after_connect_raises_relay_error(tmp_path):
    """A master that dies under a connected client: RelayError, not b'' or a hang."""
    skip_without_mooncake()
    from rose.stack.mooncake import start_mooncake
    from storage.relay.mooncake import MooncakeRelay

    services = start_mooncake(tmp_path, store_mb=0)  # its master is the last process
    relay = None
    try:
        relay = MooncakeRelay(services.master_addr, services.metadata_url, segment_bytes=16 << 20,
                              local_buffer_bytes=8 << 20)
        relay.put("t/k", b"v")
        services.processes[-1].stop(grace=1)  # the master
        unreachable = f"master at {services.master_addr} unreachable"
        with pytest.raises(RelayError, match=unreachable):
            relay.get("t/k")
        with pytest.raises(RelayError, match=unreachable):
            relay.put("t/k2", b"v")
        with pytest.raises(RelayError, match=unreachable):
            relay.exists("t/k")
        with pytest.raises(RelayError, match=unreachable):
            relay.exists_many(["t/k", "t/k2"])
    finally:
        if relay is not None:
            relay.close()
        services.stop()


def test_a_store_client_gone_under_its_dummy_clients_fails_each_op_at_once(tmp_path):
    """The stack's store client dies (its values with it) while the master runs on: every op
    of a client of it raises RelayError naming the store client, at once, instead of waiting
    out a reconnect that cannot come (8 s per op) and then blaming the master."""
    import time

    skip_without_mooncake()
    from rose.stack.mooncake import start_mooncake
    from storage.relay.mooncake import PROBE_EVERY_S, MooncakeRelay
    from storage.relay.mooncake_client import answers

    services = start_mooncake(tmp_path, store_mb=64)  # the store client is the last process
    relay = None
    try:
        assert services.client_addr, services.client_error
        relay = MooncakeRelay(services.master_addr, services.metadata_url, segment_bytes=0,
                              local_buffer_bytes=8 << 20, client_addr=services.client_addr)
        relay.put("t/k", b"v")
        relay.put("t/big", os.urandom(2 << 20))
        services.processes[-1].stop(grace=1)
        time.sleep(PROBE_EVERY_S)  # an op within that of the last probe pays one RPC timeout
        gone = f"store client at {services.client_addr} is gone"
        for op in (lambda: relay.get("t/k"), lambda: relay.put("t/k2", b"v"),
                   lambda: relay.put("t/k3", os.urandom(2 << 20)),
                   lambda: relay.exists("t/k"), lambda: relay.get_many(["t/big"])):
            t0 = time.monotonic()
            with pytest.raises(RelayError, match=gone):
                op()
            assert time.monotonic() - t0 < 2.0
        assert services.alive() is False and answers(services.master_addr)  # the master runs on
    finally:
        if relay is not None:
            relay.close()
        services.stop()


class _PutUnderWay:
    """A Mooncake store stand-in for get_size alone: -703 (REPLICA_IS_NOT_READY, what a reader
    gets while the key's put is under way) `busy` times, then the value's size."""

    def __init__(self, busy: int, size: int = 5) -> None:
        self.busy, self.size = busy, size

    def get_size(self, key: str) -> int:
        self.busy -= 1
        return -703 if self.busy >= 0 else self.size


def test_a_put_under_way_is_waited_for_then_reads_as_missing_never_a_failure(monkeypatch):
    """A receiver polling a manifest while the publisher puts it: found once the put lands;
    still not ready after the wait, it is not published yet (RelayKeyMissing), not RelayError
    (seen in a full run as 'get ... failed with -703')."""
    import storage.relay.mooncake as mc

    relay = object.__new__(mc.MooncakeRelay)  # _size needs no live client: the store is given
    relay.master_addr = "127.0.0.1:0"
    assert relay._size(_PutUnderWay(busy=3), "rose/r/v1/manifest") == 5
    monkeypatch.setattr(mc, "_NOT_READY_WAIT_S", 0.05)
    with pytest.raises(RelayKeyMissing, match="still being written"):
        relay._size(_PutUnderWay(busy=10**6), "rose/r/v1/manifest")


def test_small_batch_reads_share_one_registered_buffer_and_own_their_bytes(mooncake_pair, ns):
    """A batch read up to staging_bytes lands in the client's one registered staging buffer
    and is copied out: what a read returned stays the caller's when the next read reuses the
    buffer. Larger reads register a buffer of their own; staging_bytes=0 turns staging off."""
    from storage.relay.mooncake import MooncakeRelay

    writer, reader = mooncake_pair
    first, second = os.urandom(300_000), os.urandom(200_000)
    big = os.urandom(reader.staging_bytes + 1)
    for name, value in (("first", first), ("second", second), ("big", big)):
        writer.put(f"{ns}/{name}", value)
    got_first = reader.get_many([f"{ns}/first"])[0]
    staging = reader._staging
    assert staging is not None and staging.nbytes == reader.staging_bytes
    got = reader.get_many([f"{ns}/second", f"{ns}/first"])
    assert reader._staging is staging  # registered once, reused
    assert bytes(got_first) == first  # not overwritten by the read that reused the buffer
    assert bytes(got[0]) == second and bytes(got[1]) == first
    assert bytes(reader.get_many([f"{ns}/big"])[0]) == big
    off = MooncakeRelay(reader.master_addr, reader.metadata_url, segment_bytes=0,
                        staging_bytes=0)
    try:
        assert bytes(off.get_many([f"{ns}/second"])[0]) == second and off._staging is None
    finally:
        off.close()
    with pytest.raises(ValueError, match="staging_bytes"):
        MooncakeRelay(reader.master_addr, reader.metadata_url, staging_bytes=-1)


def test_shared_memory_clients_move_values_larger_than_their_buffer(mooncake_shared_pair, ns):
    """Dummy clients of the stack's store client (as `rose up` opens them): values larger than
    the shared buffer grow it, and a batch larger than it is read in turns; every value comes
    back whole and stays the caller's after the next read."""
    writer, reader = mooncake_shared_pair
    big, mid, small = os.urandom(24 << 20), os.urandom(10 << 20), os.urandom(3000)
    for name, value in (("big", big), ("mid", mid), ("mid2", mid[::-1]), ("small", small)):
        writer.put(f"{ns}/{name}", value)
    got = reader.get_many([f"{ns}/mid", f"{ns}/mid2", f"{ns}/small", f"{ns}/big"])
    first = bytes(got[0])
    assert [bytes(v) for v in got] == [mid, mid[::-1], small, big]
    reader.get_many([f"{ns}/mid2"])
    assert bytes(got[0]) == first  # not the shared buffer: the next read did not overwrite it
    assert reader.get(f"{ns}/small") == small and reader.exists_many([f"{ns}/big", f"{ns}/x"]) \
        == [True, False]
    assert writer.remove_prefix(f"{ns}/") == 4 and not reader.exists(f"{ns}/big")


def test_objects_outlive_the_shared_writer_and_a_tcp_reader_reads_them(mooncake, ns):
    """In the store client's segment, what a publisher put outlives its client (a trainer
    that restarts), and a reader without shared memory (another host's) reads it over TCP."""
    from storage.relay.mooncake import MooncakeRelay

    writer = MooncakeRelay(mooncake.master_addr, mooncake.metadata_url, segment_bytes=0,
                           local_buffer_bytes=16 << 20, client_addr=mooncake.client_addr)
    value = os.urandom(5 << 20)
    writer.put(f"{ns}/bucket", value)
    writer.close()
    tcp = MooncakeRelay(mooncake.master_addr, mooncake.metadata_url, segment_bytes=0,
                        local_buffer_bytes=16 << 20)
    try:
        assert bytes(tcp.get_many([f"{ns}/bucket"])[0]) == value
        assert tcp.remove(f"{ns}/bucket")
    finally:
        tcp.close()


def test_make_relay_is_a_shared_memory_client_where_the_stack_runs_a_store_client(
        mooncake, monkeypatch, ns):
    from rose.stack.mooncake import mooncake_env

    env = mooncake_env(mooncake)
    assert env["ROSE_MOONCAKE_CLIENT"] == mooncake.client_addr
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with make_relay("mooncake", segment_bytes=0, local_buffer_bytes=8 << 20) as relay:
        assert relay.client_addr == mooncake.client_addr
        relay.put(f"{ns}/k", os.urandom(2 << 20))  # no segment of its own: the store's
        assert relay.exists(f"{ns}/k") and relay.remove(f"{ns}/k")
    # addresses given explicitly: that master's relay, not the env's store client
    with make_relay("mooncake", master_addr=mooncake.master_addr,
                    metadata_url=mooncake.metadata_url, segment_bytes=16 << 20) as relay:
        assert relay.client_addr is None


def test_a_store_client_that_cannot_start_leaves_the_master_and_says_why(tmp_path):
    skip_without_mooncake()
    from rose.stack.mooncake import start_mooncake

    services = start_mooncake(tmp_path, store_mb=1 << 40)  # a segment no machine has
    try:
        assert services.client_addr is None and "mooncake-store-client" in services.client_error
        assert services.alive()  # the master and metadata server run on
    finally:
        services.stop()


def test_a_process_that_cannot_reach_the_store_client_uses_tcp_clients_loudly(
        mooncake, monkeypatch, caplog, ns):
    """shared_relay where the env names a store client this process cannot use (here: none
    listens there): an error in the log, and clients of the process's own, by role."""
    import storage.relay.pool as pool
    from rose.stack.mooncake import mooncake_env
    from rose.stack.ports import free_port

    for k, v in mooncake_env(mooncake).items():
        monkeypatch.setenv(k, v)
    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("ROSE_MOONCAKE_CLIENT", dead)
    monkeypatch.setattr(pool, "_clients", {})
    with caplog.at_level("ERROR", logger="rose.relay"):
        publisher = pool.shared_relay("mooncake", "publisher")
    reader = pool.shared_relay("mooncake", "reader")
    try:
        assert f"store client at {dead}" in caplog.text
        assert publisher.client_addr is None and reader.client_addr is None
        assert publisher is not reader  # by role again: the publisher has a segment of its own
        publisher.put(f"{ns}/k", os.urandom(2 << 20))
        assert reader.exists(f"{ns}/k") and publisher.remove(f"{ns}/k")
    finally:
        publisher.close()
        reader.close()
