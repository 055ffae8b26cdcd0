"""Pipelined vs plain publish-to-applied, side by side, on one synthetic model (issue 15 item 2).

Pipelined: the sender puts bucket k while k+1 is encoded (storage/weights/push_pipeline.py);
the receiver fetches buckets on threads and decodes and writes each into the weights it holds
as it arrives (storage/weights/apply_pipeline.py). Plain: encode-then-put bucket by bucket,
then fetch and verify every bucket before decoding into new tensors. Both through one
filesystem relay on tmpfs in this process (puts paced by tests/transfer_e2e.PacedRelay to the
rate; 0: unpaced), the receiver already holding v0, for two ways to move v1:
  dense  raw bf16 in full (publish_weights), written into the v0 tensors
  ours   the sparse delta of storage/weights/sparse_publisher.py, applied onto v0
Every pull is checked bit for bit against v1. Times are the best of --repeat runs (this
machine is shared). Sender and receiver run one after the other here, so the total is
publish + pull: what the pipelines overlap is inside each side.

    .venv/bin/python bench/transfer_pipeline.py [--params 50e6] [--gbps 1 10 0]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.transfer_e2e import PacedRelay  # noqa: E402
from bench.transfer_workloads import synthetic_model  # noqa: E402
from storage.atomic import write_atomic  # noqa: E402
from storage.relay.filesystem import FilesystemRelay  # noqa: E402
from storage.weights import publisher, sparse_publisher  # noqa: E402
from storage.cores import available_cores  # noqa: E402
from storage.weights.receiver import WeightReceiver  # noqa: E402
from storage.weights.digest import tensors_digest  # noqa: E402
from storage.weights.sparse_publisher import SparsePublisher  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PUBLISH = publisher.publish_weights


def once(root: Path, method: str, old: dict, new: dict, gbps: float, pipelined: bool,
         bucket_bytes: int, run: str) -> dict:
    relay = FilesystemRelay(root)
    link = PacedRelay(relay, gbps) if gbps > 0 else relay
    # SparsePublisher has no switch of its own: the bench hands it publish_weights with one
    sparse_publisher.publish_weights = partial(PUBLISH, pipelined=pipelined)
    try:
        rx = WeightReceiver(relay, run, full_timeout_s=30, pipelined=pipelined)
        if method == "dense":
            PUBLISH(relay, run, 0, old, bucket_bytes)
            rx.pull(0)
            t0 = time.perf_counter()
            stats = PUBLISH(link, run, 1, new, bucket_bytes, workers=available_cores(),
                            pipelined=pipelined)
            pushed = stats.bytes
        else:
            pub = SparsePublisher(relay, run, bucket_bytes)
            pub.publish(0, old)
            rx.pull(0)
            pub.relay = link
            t0 = time.perf_counter()
            pushed = pub.publish(1, new).pushed_bytes
        t1 = time.perf_counter()
        report = rx.pull(1)
        t2 = time.perf_counter()
    finally:
        sparse_publisher.publish_weights = PUBLISH
        relay.remove_prefix(f"rose/{run}/")
    if tensors_digest(rx.tensors) != tensors_digest(new) or report.version != 1:
        raise AssertionError(f"{method} pull of {run} is not bit-exact")
    return {"method": method, "pipelined": pipelined, "gbps": gbps, "bytes": pushed,
            "publish_s": t1 - t0, "pull_s": t2 - t1, "total_s": t2 - t0,
            "fetch_s": report.fetch_s, "apply_s": report.apply_s, "mode": report.mode}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=50e6)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--gbps", type=float, nargs="+", default=[1, 10, 0])
    p.add_argument("--bucket-mb", type=int, default=16)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "transfer_pipeline.json")
    args = p.parse_args()
    old, new, dims = synthetic_model(args.params, args.lr, 1)
    load_before = os.getloadavg()  # the machine is shared: say how busy it was
    shm = Path("/dev/shm")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rose-bench-pipe-",
                                     dir=shm if shm.is_dir() else None) as tmp:
        for gbps in args.gbps:
            for method in ("dense", "ours"):
                pair = {}
                for pipelined in (False, True):
                    runs = [once(Path(tmp), method, old, new, gbps, pipelined,
                                 args.bucket_mb << 20, f"b-{method}-{pipelined:d}-{i}")
                            for i in range(args.repeat)]
                    pair[pipelined] = min(runs, key=lambda r: r["total_s"])
                    rows.append({**pair[pipelined], "repeat": args.repeat})
                plain, piped = pair[False], pair[True]
                print(f"{method:5s} @ {gbps or 'unpaced'} Gbps: plain {plain['total_s']:.2f} s "
                      f"(publish {plain['publish_s']:.2f} + pull {plain['pull_s']:.2f}), "
                      f"pipelined {piped['total_s']:.2f} s (publish {piped['publish_s']:.2f} + "
                      f"pull {piped['pull_s']:.2f}): {plain['total_s'] / piped['total_s']:.2f}x")
    payload = {"bench": "transfer_pipeline", "machine": platform.platform(),
               "cores": available_cores(), "params": args.params, "lr": args.lr,
               "dense_bytes": sum(t.numel() * t.element_size() for t in new.values()),
               "bucket_bytes": args.bucket_mb << 20, "relay": "filesystem on tmpfs",
               "dims": dims, "loadavg_before_after": [load_before, os.getloadavg()],
               "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, json.dumps(payload, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
