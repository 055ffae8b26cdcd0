"""Small batch reads from Mooncake: a staging buffer registered once per client, against a
buffer registered and unregistered for every read (storage/relay/mooncake.py get_many).

A writer client owns the segment (as the trainer does); two reader clients without one read
the same keys, one with staging (the relay's default `staging_bytes`) and one with it off
(staging_bytes=0), alternating read by read so both see the same machine state. Both clients
live in this process; their reads still cross the transfer engine's loopback TCP. Median of
`--repeat` reads per size; prints a table and writes JSON.

    .venv/bin/python -m bench.transfer.relay_small_reads [--repeat 100]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib.results import RESULTS, print_table, write_result
from rose.stack.mooncake import start_mooncake
from storage.relay.mooncake import MooncakeRelay

SIZES = [100_000, 1_700_000, 4 << 20, 8 << 20, 16 << 20]  # 1.7 MB: the demo policy's bucket


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--out", type=Path,
                   default=RESULTS / "relay_small_reads.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rose-bench-small-reads-") as tmp:
        services = start_mooncake(Path(tmp))
        clients = []
        try:
            writer = MooncakeRelay(services.master_addr, services.metadata_url,
                                   segment_bytes=256 << 20)
            staged = MooncakeRelay(services.master_addr, services.metadata_url, segment_bytes=0)
            fresh = MooncakeRelay(services.master_addr, services.metadata_url, segment_bytes=0,
                                  staging_bytes=0)
            clients = [writer, staged, fresh]
            for size in SIZES:
                key = f"bench/small-reads/{size}"
                writer.put(key, np.random.default_rng(size).integers(0, 255, size, np.uint8))
                times: dict[str, list[float]] = {"staged": [], "fresh": []}
                for _ in range(args.repeat):
                    for name, relay in (("staged", staged), ("fresh", fresh)):
                        t = time.perf_counter()
                        relay.get_many([key])
                        times[name].append(time.perf_counter() - t)
                if bytes(staged.get_many([key])[0]) != bytes(fresh.get_many([key])[0]):
                    raise AssertionError(f"staged and fresh reads of {size} bytes differ")
                row = {"bytes": size, **{f"{n}_ms": 1e3 * statistics.median(v)
                                         for n, v in times.items()}}
                row["speedup"] = row["fresh_ms"] / row["staged_ms"]
                rows.append(row)
                writer.remove(key)
        finally:
            for client in clients:
                client.close()
            services.stop()
    print_table(f"Mooncake get_many of one key, median of {args.repeat} alternating reads "
                f"(staging up to {staged.staging_bytes >> 20} MB)",
                ("bytes", "staged ms", "registered per read ms", "fresh / staged"),
                [(f"{r['bytes']:,}", f"{r['staged_ms']:.2f}", f"{r['fresh_ms']:.2f}",
                  f"{r['speedup']:.2f}x") for r in rows])
    write_result(args.out, "relay_small_reads", args, t0, repeat=args.repeat,
                 staging_bytes=staged.staging_bytes, rows=rows)

if __name__ == "__main__":
    main()
