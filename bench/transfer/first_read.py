"""A small version's pull: its manifest and buckets in one round trip, or one after the other.

The demo policy (1.7 MB, one bucket) is published as `rose train` publishes it at a fast
link (a delta all sent raw: pulled once complete), through the relay as `rose up` opens it
(store client, tests' and bench/transfer/transfer.py's start_relay). One receiver pulls each version
with its manifest and buckets read together (storage/weights/first_read.py), another with
the guess off (manifest, then buckets), and the dense path (apply_pipeline.pull_weights) beside
them, alternating version by version so all three see the same machine. Median of
`--repeat` pulls each; prints a table and writes JSON.

    .venv/bin/python -m bench.transfer.first_read [--repeat 300]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tests.transfer_e2e import start_relay
from bench.transfer.transfer_workloads import demo_policy_model
from storage.weights import first_read
from storage.weights.apply_pipeline import pull_weights
from storage.weights.publisher import publish_weights
from storage.weights.receiver import WeightReceiver
from storage.weights.sparse_publisher import SparsePublisher

from bench.lib.results import RESULTS, write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=300)
    p.add_argument("--out", type=Path, default=RESULTS / "first_read.json")
    args = p.parse_args()
    old, new = demo_policy_model(5e-4, 1)
    times: dict[str, list[float]] = {"one round trip": [], "manifest, then buckets": [],
                                     "dense (pull_weights)": []}
    with tempfile.TemporaryDirectory(prefix="rose-first-read-") as tmp:
        services, relay = start_relay(Path(tmp), 64 << 20)
        try:
            pub = SparsePublisher(relay, "fr", link_gbps=100.0)
            pub.publish(0, old, copy=False)
            publish_weights(relay, "fr-dense", 0, old)
            guessing, plain = WeightReceiver(relay, "fr"), WeightReceiver(relay, "fr")
            guessing.pull(0), plain.pull(0)
            guess_bytes = first_read.GUESS_BYTES
            for v in range(1, args.repeat + 1):
                weights = new if v % 2 else old
                pub.publish(v, weights, copy=False)
                publish_weights(relay, "fr-dense", v, weights)
                for label, pull in (("one round trip", lambda: guessing.pull(v)),
                                    ("manifest, then buckets", lambda: plain.pull(v)),
                                    ("dense (pull_weights)",
                                     lambda: pull_weights(relay, "fr-dense", v))):
                    first_read.GUESS_BYTES = 0 if label.startswith("manifest") else guess_bytes
                    t = time.perf_counter()
                    pull()
                    times[label].append(time.perf_counter() - t)
            first_read.GUESS_BYTES = guess_bytes
        finally:
            relay.close()
            services.stop()
    medians = {k: statistics.median(v) for k, v in times.items()}
    table = Table(title=f"pull of a {sum(t.numel() * t.element_size() for t in new.values()) / 1e6:.1f}"
                        f" MB version all sent raw, median of {args.repeat}")
    for col in ("pull", "ms", "x one round trip"):
        table.add_column(col, justify="right")
    for label, m in medians.items():
        table.add_row(label, f"{m * 1e3:.3f}", f"{m / medians['one round trip']:.2f}")
    Console().print(table)
    write_json(args.out, {"bench": "first_read", "machine": platform.platform(),
                          "repeat": args.repeat, "median_s": medians, "seconds": times})


if __name__ == "__main__":
    main()
