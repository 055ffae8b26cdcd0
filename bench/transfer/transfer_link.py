"""Choosing by the measured link and host when the configured rate is wrong
(publish.measure_link, publish.measure_cpu).

A trainer publishes the synthetic Qwen shape (--params, AdamW at --lr, one step) as a full
snapshot, then --deltas deltas (the two versions turn about, each a delta onto the other),
through a Mooncake master and store on loopback whose puts are paced to the TRUE rate
(tests/transfer_e2e.py's emulation of a cross-cluster link), to a receiver in a process of its
own that pulls each version bit-exactly (told before the push when the version streams, as
`rose train`'s engines are). Per scenario (configured rate, true rate), four publishers:

  fixed     chooses each tensor's form by the configured rate and the time model's CPU costs
            as fitted on the project's VM (publish.measure_link and measure_cpu off)
  link      starts from the configured rate, then chooses by what its own bucket puts and the
            receiver's gets measured (storage/weights/link_rate.py); CPU costs as fitted
  measured  the measured link, and CPU costs at this host's probed speed
            (storage/delta/host_speed.py), as `rose train` does
  oracle    chooses by the true rate and this host's speed, as if the operator had set it right

Per delta: publish-to-applied seconds (push start to the receiver's verified answer), bytes on
the wire, the rate it was chosen by, and (measured) both legs as measured after it: the puts
are paced, the gets are this machine's loopback, which on a small host may be the slower
leg. The table gives each publisher's median over the deltas and its ratio to fixed; the first
delta already follows the full snapshot's measurement. Most of a scenario's time is its full
snapshots on the slow link. The last scenario's rate is right (5 / 5): there `fixed` against
`oracle` is the time model's CPU costs as fitted against this host's probed speed. The JSON
keeps the probe's factors (`host_speed`).

    .venv/bin/python -m bench.transfer.transfer_link [--params 100e6] [--lr 1e-5] [--deltas 3]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

from tests.transfer_e2e import PacedRelay, _reader, start_relay
from bench.transfer.transfer_workloads import synthetic_model
from bench.lib.results import RESULTS, write_result

POLICIES = ("fixed", "link", "measured", "oracle")


def _pull(conn, run: str, version: int, streams: bool) -> dict:
    """The receiver's answer for `version` (asked before the push when it streams)."""
    if not streams:
        conn.send(("sparse", run, version))
    seconds, report, digest = conn.recv()
    return {**report, "pull_s": seconds, "digest": digest}


def run_policy(writer, conn, policy: str, configured: float, true: float,
               versions: list[dict], wants: list[str], tag: str) -> list[dict]:
    """Publish versions[0] full, then each next one as a delta, under `policy`; one row per
    delta."""
    from storage.weights.link_rate import LinkRate
    from storage.weights.sparse_publisher import SparsePublisher

    link = PacedRelay(writer, true)
    run = f"link-{tag}-{policy}"
    pub = SparsePublisher(link, run, link_gbps=true if policy == "oracle" else configured,
                          link_rate=LinkRate() if policy in ("link", "measured") else None,
                          measure_cpu=policy in ("measured", "oracle"))
    rows = []
    for version, (weights, want) in enumerate(zip(versions, wants)):
        t0 = time.perf_counter()
        streams = pub.streams(version, weights)
        if streams:
            conn.send(("stream", run, version))
        report = pub.publish(version, weights, copy=False)
        pulled = _pull(conn, run, version, streams)
        total = time.perf_counter() - t0
        if pulled["digest"] != want:
            raise AssertionError(f"{run} v{version}: the receiver's weights are not bit-exact")
        pub.observe_gets(pulled["get_bytes"], pulled["get_s"])
        if version:
            rows.append({"policy": policy, "version": version, "kind": report.kind,
                         "chosen_gbps": report.link_gbps, "bytes": report.pushed_bytes,
                         "raw_tensors": sum(t.encoding == "raw" for t in report.tensors),
                         "tensors": len(report.tensors), "publish_s": report.seconds,
                         "total_s": total, "mode": pulled["mode"],
                         "streamed_buckets": pulled["streamed"],
                         "measured_legs": None if pub.link_rate is None  # after this publish
                         else pub.link_rate.as_dict()})
    writer.remove_prefix(f"rose/{run}/")
    conn.send(("drop", run, 0))
    conn.recv()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=100e6, help="synthetic model size")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--deltas", type=int, default=3)
    p.add_argument("--scenarios", type=float, nargs="+", default=[10, 1, 1, 10, 5, 5],
                   metavar="GBPS", help="pairs: configured rate, true rate")
    p.add_argument("--out", type=Path, default=RESULTS / "transfer_link.json")
    args = p.parse_args()
    if len(args.scenarios) % 2 or args.deltas < 1:
        p.error("--scenarios takes pairs of rates (configured, true); --deltas >= 1")
    from rich.console import Console
    from rich.table import Table

    from storage.delta import host_speed, kernels
    from storage.weights.digest import tensors_digest

    t_start = time.perf_counter()
    kernels.warm_up()
    old, new, _ = synthetic_model(args.params, args.lr, 1)
    versions = [old if i % 2 == 0 else new for i in range(args.deltas + 1)]
    wants = [tensors_digest(v) for v in versions]
    dense = sum(t.numel() * t.element_size() for t in old.values())
    scenarios = list(zip(args.scenarios[::2], args.scenarios[1::2]))
    rows: list[dict] = []
    console = Console()
    with tempfile.TemporaryDirectory(prefix="rose-link-mc-") as tmp:
        # as `rose up`: the versions in the stack's store client, both processes clients of it
        services, writer = start_relay(Path(tmp), 4 * dense + (256 << 20))
        parent, child = mp.get_context("spawn").Pipe()
        proc = mp.get_context("spawn").Process(
            target=_reader, args=(child, services.master_addr, services.metadata_url, 1 << 30,
                                  None, services.client_addr), daemon=True)
        try:
            proc.start()
            child.close()  # the reader's end is its own: if it dies, recv() fails, never hangs
            if parent.recv() != "ready":
                raise RuntimeError("receiver process did not start")
            for s, (configured, true) in enumerate(scenarios):
                for policy in POLICIES:
                    got = run_policy(writer, parent, policy, configured, true, versions, wants,
                                     f"{s}")
                    rows += [{"configured_gbps": configured, "true_gbps": true, **r} for r in got]
                    console.print(f"  configured {configured:g} / true {true:g} Gbps, {policy}: "
                                  + ", ".join(f"{r['total_s']:.2f} s" for r in got))
        finally:
            if proc.is_alive():
                parent.send(None)
                proc.join(timeout=30)
            writer.close()
            services.stop()
    summary = []
    table = Table(title=f"Publish-to-applied when publish.link_gbps is wrong: synthetic "
                        f"{args.params / 1e6:.0f}M, lr {args.lr:g}, median of {args.deltas} deltas")
    for col in ("configured", "true", "policy", "chosen Gbps", "MB on wire", "raw tensors",
                "seconds", "fixed / it"):
        table.add_column(col, justify="right")
    for configured, true in scenarios:
        mine = [r for r in rows if (r["configured_gbps"], r["true_gbps"]) == (configured, true)]
        fixed = statistics.median(r["total_s"] for r in mine if r["policy"] == "fixed")
        for policy in POLICIES:
            its = [r for r in mine if r["policy"] == policy]
            med = statistics.median(r["total_s"] for r in its)
            chosen = statistics.median(r["chosen_gbps"] for r in its)
            summary.append({"configured_gbps": configured, "true_gbps": true, "policy": policy,
                            "median_total_s": med, "fixed_over_it": fixed / med,
                            "median_chosen_gbps": chosen,
                            "median_mb": statistics.median(r["bytes"] for r in its) / 1e6})
            table.add_row(f"{configured:g}", f"{true:g}", policy, f"{chosen:.2f}",
                          f"{summary[-1]['median_mb']:.1f}",
                          f"{statistics.median(r['raw_tensors'] for r in its):.0f}/"
                          f"{its[0]['tensors']}", f"{med:.3f}", f"{fixed / med:.2f}x")
    console.print(table)
    write_result(args.out, "transfer_link", args, t_start, dense_bytes=dense,
                 host_speed=[{"method": m, "encode": e, "apply": a}
                             for m, e, a in host_speed.measured().factors],
                 summary=summary, rows=rows)


if __name__ == "__main__":
    main()
