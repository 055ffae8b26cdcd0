"""When a publish's buckets go on the link: the sender's put timeline over a slow link.

On a link-bound transfer the publish takes the link time plus whatever time the link sits idle:
before the first bucket is put, and between buckets when the next is not packed yet. This bench
publishes one delta (the synthetic Qwen shape, AdamW at --lr, one step, chosen by time for the
link as `rose train` publishes) and back, `--repeat` times per rate, into a Mooncake relay as
`rose up` opens it (store client; the sender alone: no receiver pulls), with puts paced to each
rate in --gbps (tests/transfer_e2e.PacedRelay). Per rate, medians over the publishes: publish
seconds, link seconds (bytes put / rate), when the first bucket's put began, the seconds the
link sat idle between the first and the last bucket, and publish / link.

    .venv/bin/python -m bench.transfer.transfer_timeline [--params 100e6] [--gbps 0.05 0.2] [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result



def timeline(relay, old: dict, new: dict, gbps: float, repeat: int, run: str) -> list[dict]:
    """`repeat` publishes of new and old in turn (each a delta onto the other) over `relay`
    paced to `gbps`; per publish its seconds and its bucket puts' (start, end) from its start."""
    from tests.transfer_e2e import PacedRelay
    from storage.weights.link_rate import LinkRate
    from storage.weights.sparse_publisher import SparsePublisher

    paced = PacedRelay(relay, gbps)
    puts: list[tuple[float, float, int]] = []
    start = [0.0]
    put = paced.put

    def timed_put(key: str, data) -> None:  # bucket puts only: not infos, manifest, lists
        t = time.perf_counter()
        put(key, data)
        if key.rsplit("/", 1)[-1].startswith("bucket-") and not key.endswith(".info"):
            puts.append((t - start[0], time.perf_counter() - start[0], memoryview(data).nbytes))
    paced.put = timed_put
    pub = SparsePublisher(paced, run, link_gbps=gbps, link_rate=LinkRate(), measure_cpu=True)
    pub.publish(0, old, copy=False)
    rows = []
    for version in range(1, repeat + 1):
        puts.clear()
        start[0] = time.perf_counter()
        report = pub.publish(version, new if version % 2 else old, copy=False)
        seconds = time.perf_counter() - start[0]
        busy = sum(end - begin for begin, end, _ in puts)
        rows.append({"publish_s": seconds, "link_s": report.pushed_bytes * 8 / (gbps * 1e9),
                     "first_put_s": puts[0][0], "idle_s": puts[-1][1] - puts[0][0] - busy,
                     "buckets": len(puts), "mb": report.pushed_bytes / 1e6})
    relay.remove_prefix(f"rose/{run}/")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=100e6, help="synthetic model size")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--gbps", type=float, nargs="+", default=[0.05, 0.2])
    p.add_argument("--repeat", type=int, default=5, help="publishes per rate")
    p.add_argument("--out", type=Path, default=RESULTS / "transfer_timeline.json")
    args = p.parse_args()
    if min(args.gbps) <= 0 or args.repeat < 1:
        sys.exit("--gbps must be > 0 (a paced link) and --repeat >= 1")
    import torch

    from tests.transfer_e2e import start_relay
    from bench.transfer.transfer_workloads import synthetic_model
    from storage.delta import host_speed, kernels

    t0 = time.perf_counter()
    torch.set_num_threads(1)
    kernels.warm_up()  # as a long-lived trainer has, and its coding speed probed
    host_speed.measured()
    old, new, _ = synthetic_model(args.params, args.lr, 1)
    dense = sum(t.numel() * t.element_size() for t in new.values())
    out = []
    with tempfile.TemporaryDirectory(prefix="rose-timeline-") as tmp:
        services, relay = start_relay(Path(tmp), 2 * dense + (256 << 20))
        try:
            for rate in args.gbps:
                rows = timeline(relay, old, new, rate, args.repeat, f"timeline-{rate:g}")
                med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                out.append({"gbps": rate, **med, "over_link": med["publish_s"] / med["link_s"],
                            "publishes": rows})
        finally:
            relay.close()
            services.stop()
    print_table(f"bucket puts of one publish, {args.params / 1e6:.0f}M params, lr {args.lr:g} "
                f"(sender only; medians of {args.repeat})",
                ("Gbps", "MB", "buckets", "link s", "publish s", "first put at s",
                 "idle between puts s", "publish / link"),
                [(f"{r['gbps']:g}", f"{r['mb']:.1f}", f"{r['buckets']:.0f}", f"{r['link_s']:.3f}",
                  f"{r['publish_s']:.3f}", f"{r['first_put_s']:.3f}", f"{r['idle_s']:.3f}",
                  f"{r['over_link']:.2f}x") for r in out])
    write_result(args.out, "transfer_timeline", args, t0, rates=out)


if __name__ == "__main__":
    main()
