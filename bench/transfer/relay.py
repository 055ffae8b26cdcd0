"""Relay throughput: Mooncake plain vs zero-copy put/get of 64 MB buckets, the filesystem relay,
a plain loopback TCP socket carrying the same bytes between the same two processes (the
baseline the relay is held to: >= 50% of it), and publish_weights / pull_weights end to end.

Two Mooncake layouts, side by side: clients of their own (the writer is this process and owns
the segment, like a trainer; the reader is a second process with no segment, like a rollout
worker, so gets cross a process boundary over TCP), and as `rose up` opens them: both dummy
clients of the stack's store client (mooncake_client), which holds the objects, each transfer
one copy through memory shared with it (storage/relay/mooncake_pool.py). Starts its own
Mooncake master, metadata server and store client on free loopback ports.

    .venv/bin/python -m bench.transfer.relay [--buckets 4] [--bucket-mb 64] [--repeat 3]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import socket
import threading
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.lib.results import RESULTS, write_json


def _reader(conn, master: str, metadata: str, client_addr: str | None = None) -> None:
    """Second process: answers ("plain"|"single"|"batch"|"pull", keys/run) with seconds taken;
    a dummy client of the store client at `client_addr` when given."""
    from storage.relay.mooncake import MooncakeRelay
    from storage.weights.apply_pipeline import pull_weights

    relay = MooncakeRelay(master, metadata, segment_bytes=0, local_buffer_bytes=128 << 20,
                          client_addr=client_addr)
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        mode, arg = msg
        t = time.perf_counter()
        if mode == "socket":  # the baseline: the same bytes over one loopback TCP connection
            n = _receive(*arg)
        elif mode == "plain":
            n = sum(len(relay._store.get(k)) for k in arg)  # the copy-through-buffer baseline
        elif mode == "single":
            n = sum(relay.get_many([k])[0].nbytes for k in arg)
        elif mode == "batch":
            n = sum(v.nbytes for v in relay.get_many(arg))
        else:
            stats: dict = {}
            _, tensors = pull_weights(relay, arg, stats=stats)
            n = sum(t.numel() * t.element_size() for t in tensors.values())
            conn.send((time.perf_counter() - t, n, stats))
            continue
        conn.send((time.perf_counter() - t, n, {}))
    relay.close()


_landing: dict[int, memoryview] = {}  # reused like the relay's registered buffers


def _receive(port: int, nbytes: int) -> int:
    """Read nbytes from the writer's socket into one preallocated buffer (no per-chunk copies)."""
    if nbytes not in _landing:
        _landing[nbytes] = memoryview(bytearray(nbytes))
    view, got = _landing[nbytes], 0
    with socket.create_connection(("127.0.0.1", port)) as conn:
        while got < nbytes:
            n = conn.recv_into(view[got:])
            if n == 0:
                raise ConnectionError(f"socket closed after {got} of {nbytes} bytes")
            got += n
    return got


def _socket_reader(conn) -> None:
    """A reader with no Mooncake client: the socket baseline on a machine with no relay running."""
    while (msg := conn.recv()) is not None:
        t = time.perf_counter()
        n = _receive(*msg[1])
        conn.send((time.perf_counter() - t, n, {}))


def _over_socket(blobs, conn) -> float:
    """Send the blobs to the reader at the other end of `conn` over one loopback TCP connection;
    the reader's seconds from connect to the last byte."""
    total = sum(b.nbytes for b in blobs)
    with socket.create_server(("127.0.0.1", 0)) as server:
        def send() -> None:
            peer, _ = server.accept()
            with peer:
                for b in blobs:
                    peer.sendall(memoryview(b))
        sender = threading.Thread(target=send)
        sender.start()
        conn.send(("socket", (server.getsockname()[1], total)))
        seconds, n, _ = conn.recv()
        sender.join()
    assert n == total
    return seconds


def _best(fn, repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import numpy as np
    import torch

    from rose.stack.mooncake import start_mooncake
    from storage.relay.mooncake import MooncakeRelay
    from storage.relay.filesystem import FilesystemRelay
    from storage.weights.publisher import publish_weights

    size = args.bucket_mb << 20
    total = size * args.buckets
    blobs = [np.random.default_rng(i).integers(0, 255, size, dtype=np.uint8)
             for i in range(args.buckets)]
    keys = [f"bench/b{i}" for i in range(args.buckets)]
    rows: list[dict] = []

    def row(name: str, seconds: float, nbytes: int = total) -> None:
        rows.append({"case": name, "seconds": seconds, "GB/s": nbytes / seconds / 1e9})

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    alone = ctx.Process(target=_socket_reader, args=(child,))
    alone.start()
    child.close()  # the child's end is its own: if it dies, recv() fails, never hangs
    row("loopback TCP socket, before Mooncake starts", _best(lambda: _over_socket(blobs, parent),
                                                              args.repeat))
    parent.send(None)
    alone.join(10)

    tmp = Path(tempfile.mkdtemp(prefix="rose-bench-relay-"))
    # the store client holds what a shared-memory writer puts: 3 versions at most
    services = start_mooncake(tmp, store_mb=(3 * total >> 20) + 256)
    if not services.client_addr:
        raise SystemExit(f"the Mooncake store client did not start: {services.client_error}")
    parent, child = ctx.Pipe()
    reader = ctx.Process(target=_reader, args=(child, services.master_addr, services.metadata_url))
    shared_parent, shared_child = ctx.Pipe()
    shared_reader = ctx.Process(target=_reader, args=(
        shared_child, services.master_addr, services.metadata_url, services.client_addr))
    try:
        writer = MooncakeRelay(services.master_addr, services.metadata_url,
                               segment_bytes=3 * total + (256 << 20),  # 3 versions held at most
                               local_buffer_bytes=size + (16 << 20))
        reader.start()
        child.close()
        assert parent.recv() == "ready"
        shared = MooncakeRelay(services.master_addr, services.metadata_url, segment_bytes=0,
                               local_buffer_bytes=size + (16 << 20),
                               client_addr=services.client_addr)
        shared_reader.start()
        shared_child.close()
        assert shared_parent.recv() == "ready"

        lap = [0]

        def put(zero_copy: bool, relay=writer) -> float:
            # fresh keys each time, as each version's are (an upsert over a key a reader just
            # read is another case: it costs the store client a new allocation per value)
            relay.remove_prefix("bench/")
            lap[0] += 1
            keys[:] = [f"bench/{lap[0]}/b{i}" for i in range(args.buckets)]
            t = time.perf_counter()
            for k, b in zip(keys, blobs):
                if zero_copy:
                    relay.put(k, b)
                else:
                    assert relay._store.upsert(k, b, relay._config) == 0
            return time.perf_counter() - t

        def get(mode: str, conn=parent) -> float:
            conn.send((mode, keys))
            seconds, n, _ = conn.recv()
            assert n == total
            return seconds

        for _ in range(3):  # the writer's segment's pages touched, as the store client's are
            put(True)
        r = args.repeat
        row("loopback TCP socket, beside Mooncake (reader process)",
            _best(lambda: _over_socket(blobs, parent), r))
        row("mooncake put, plain upsert (copy via local buffer)", _best(lambda: put(False), r))
        row("mooncake put, zero-copy (register + upsert_from)", _best(lambda: put(True), r))
        row("mooncake get, plain get -> bytes (other process)", _best(lambda: get("plain"), r))
        row("mooncake get, zero-copy get_into per key", _best(lambda: get("single"), r))
        row("mooncake get, zero-copy batch_get_into", _best(lambda: get("batch"), r))
        writer.remove_prefix("bench/")
        put(True, shared)  # first touch of the shared memory's pages
        get("batch", shared_parent)
        row("store client: put (one copy into shared memory)", _best(lambda: put(True, shared), r))
        row("store client: get batch (other process, one copy out)",
            _best(lambda: get("batch", shared_parent), r))
        shared.remove_prefix("bench/")

        fs = FilesystemRelay(tmp / "fs-relay")

        def fs_put() -> float:
            t = time.perf_counter()
            for k, b in zip(keys, blobs):
                fs.put(k, b)
            return time.perf_counter() - t

        def fs_get() -> float:
            t = time.perf_counter()
            fs.get_many(keys)
            return time.perf_counter() - t

        row("filesystem put (tmp + rename)", _best(fs_put, args.repeat))
        row("filesystem get (page cache)", _best(fs_get, args.repeat))

        # End to end: a bf16 model of `total` bytes in 64 MB buckets.
        n_layers = 8
        g = torch.Generator().manual_seed(0)
        cols = total // (2 * n_layers * 1024)
        tensors = {f"layers.{i}.w": torch.randn(1024, cols, generator=g).to(torch.bfloat16)
                   for i in range(n_layers)}
        def publish_and_pull(relay, conn) -> tuple:
            """(best publish stats, (seconds, bytes, stats) of the best pull in the reader)."""
            pub = [publish_weights(relay, "bench", v, tensors, bucket_bytes=size)
                   for v in range(args.repeat)]
            pulls = []
            for _ in range(args.repeat):
                conn.send(("pull", "bench"))
                pulls.append(conn.recv())
            return (min(pub, key=lambda s: s.serialize_s + s.push_s),
                    min(pulls, key=lambda p: p[0]))

        best, (seconds, n, stats) = publish_and_pull(writer, parent)
        row("publish_weights: serialize (pack + xxh3)", best.serialize_s, best.bytes)
        row("publish_weights: push (zero-copy puts)", best.push_s, best.bytes)
        row("pull_weights: fetch + verify (other process)", stats["fetch_s"], n)
        row("pull_weights: decode to tensors (views)", stats["decode_s"], n)
        row("pull_weights: total", seconds, n)
        writer.remove_prefix("rose/bench/")
        writer.close()
        best, (seconds, n, stats) = publish_and_pull(shared, shared_parent)
        row("store client: publish_weights push", best.push_s, best.bytes)
        row("store client: pull_weights total (other process)", seconds, n)
        shared.remove_prefix("rose/bench/")
        shared.close()
    finally:
        for proc, conn in ((reader, parent), (shared_reader, shared_parent)):
            if proc.is_alive():
                conn.send(None)
                proc.join(10)
        services.stop()

    table = Table(title=f"relay: {args.buckets} x {args.bucket_mb} MB buckets, best of "
                        f"{args.repeat}, loopback TCP or the store client's shared memory")
    for col in ("case", "seconds", "GB/s"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        table.add_row(r["case"], f"{r['seconds']:.3f}", f"{r['GB/s']:.2f}")
    Console().print(table)
    by = {r["case"]: r["seconds"] for r in rows}
    # held to the faster of the two socket runs: the baseline as good as this machine gives it
    sock = min(by["loopback TCP socket, before Mooncake starts"],
               by["loopback TCP socket, beside Mooncake (reader process)"])
    put_s = by["mooncake put, zero-copy (register + upsert_from)"]
    get_s = by["mooncake get, zero-copy batch_get_into"]
    # relay throughput over the socket's, measured side by side: the get alone (what a puller
    # waits for once a version is published) and put + get (writer memory to reader memory)
    shared_put = by["store client: put (one copy into shared memory)"]
    shared_get = by["store client: get batch (other process, one copy out)"]
    ratios = {"mooncake get / socket": sock / get_s, "mooncake put + get / socket": sock / (put_s + get_s),
              "store client get / socket": sock / shared_get,
              "store client put + get / socket": sock / (shared_put + shared_get)}
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x the socket's throughput")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "relay.json"
    write_json(out, {"buckets": args.buckets, "bucket_mb": args.bucket_mb, "repeat": args.repeat,
                     "machine": platform.platform(), "cpus": os.cpu_count(), "rows": rows, "ratios": ratios})


if __name__ == "__main__":
    main()
