"""What judging a small version costs, with and without the samples of earlier publishes.

Before a delta goes out, the publisher judges whether every tensor goes raw (tensor_form
.all_raw): tensors that sizes alone do not send raw get a sampled density. On a small policy
whose elements mostly all move (a GRPO run's), each publish's samples find raw again; the
publisher keeps them (RawSamples) and stops sampling once a sample costs more than coding
could be expected to save. Here the demo policy's delta (and back) is published over a 1 Gbps
link (emulated pacing, as bench/transfer/transfer.py, so tensors are worth a look) through the relay
as `rose up` opens it, by two publishers turn about: one keeping its samples, one starting
afresh every publish (as before). Median judge and publish times over `--publishes`, after
five; prints a table and writes JSON.

    .venv/bin/python -m bench.transfer.transfer_judge [--publishes 40] [--rounds 2]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result
from tests.transfer_e2e import PacedRelay, start_relay
from bench.transfer.transfer_workloads import demo_policy_model
from storage.weights.link_rate import LinkRate
from storage.weights.sparse_publisher import SparsePublisher
from storage.weights.tensor_form import RawSamples



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--publishes", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--gbps", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=RESULTS / "transfer_judge.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    old, new = demo_policy_model(5e-4, 1)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rose-judge-") as tmp:
        services, relay = start_relay(Path(tmp), 64 << 20)
        try:
            for r in range(args.rounds):
                for keep in (True, False):
                    samples = RawSamples()
                    pub = SparsePublisher(PacedRelay(relay, args.gbps), f"judge-{r}-{keep}",
                                          link_gbps=args.gbps, link_rate=LinkRate(),
                                          measure_cpu=True, raw_samples=samples)
                    pub.publish(0, old, copy=False)
                    judge, total = [], []
                    for v in range(1, args.publishes + 6):
                        weights = new if v % 2 else old
                        if not keep:
                            samples.found = 0  # as every publish judged before
                        t = time.perf_counter()
                        pub.streams(v, weights)  # the judge, as tasks/publish.py asks it
                        t1 = time.perf_counter()
                        pub.publish(v, weights, copy=False)
                        if v > 5:
                            judge.append(t1 - t)
                            total.append(time.perf_counter() - t)
                    rows.append({"round": r, "samples kept": keep,
                                 "judge_ms": statistics.median(judge) * 1e3,
                                 "publish_ms": statistics.median(total) * 1e3})
        finally:
            relay.close()
            services.stop()
    print_table(f"judging the demo policy's delta at {args.gbps:g} Gbps, median of "
                f"{args.publishes} publishes",
                ("round", "samples", "judge ms", "judge + publish ms"),
                [(str(row["round"]), "kept" if row["samples kept"] else "afresh",
                  f"{row['judge_ms']:.3f}", f"{row['publish_ms']:.2f}") for row in rows])
    write_result(args.out, "transfer_judge", args, t0, rows=rows)

if __name__ == "__main__":
    main()
