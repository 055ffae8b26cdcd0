"""Where the sender's publish holds the GIL: the floor a publish on many cores cannot go under.

The codec's element passes, zstd and the relay release the GIL; the Python around them (the
chooser, headers, bucket packing, the pool's hand-offs) does not. However many cores encode,
the GIL-held seconds of one publish run one after another, so they bound its wall time from
below. This bench publishes one delta (the synthetic Qwen shape, AdamW at --lr, one step,
chosen by time for --gbps as `rose train` publishes), and back, over and over into a Mooncake
relay on loopback (the sender alone: no receiver pulls), in a child process, while py-spy
samples it with --gil (only the thread holding the GIL is sampled, without pausing it) for
each encoding-thread count in --workers. Per count: publish wall seconds, the fraction of
wall time some thread held the GIL, GIL-held ms per publish, and the functions holding it.
py-spy counts the time a GIL holder sits preempted as held, so cores kept busy by the relay's
own processes inflate it: `--relay filesystem` publishes into /dev/shm with nothing beside
the publisher, the GIL's cost itself.

Needs py-spy (the dev extra) and permission to attach to a child of this process's parent:
root, or kernel.yama.ptrace_scope = 0.

    .venv/bin/python -m bench.transfer.transfer_gil [--params 494e6] [--workers 1 2] [--seconds 20]
        [--relay mooncake|filesystem]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result
from storage.cores import available_cores
from tests.pyspy_stacks import holders



def _publisher(conn, params: float, lr: float, gbps: float, relay_kind: str) -> None:
    """Child: build v0/v1 and a relay: Mooncake (master and store on loopback, as `rose up`
    starts them) or a filesystem relay in shared memory (no relay process competing for the
    cores); then on (workers, seconds) publish the two versions turn about, each a delta onto
    the other (the same changes, sign flipped), over and over."""
    import torch

    from bench.transfer.transfer_workloads import synthetic_model
    from rose.stack.mooncake import start_mooncake
    from storage.delta import kernels
    from storage.relay.filesystem import FilesystemRelay
    from storage.relay.mooncake import MooncakeRelay
    from storage.weights.sparse_publisher import SparsePublisher
    from storage.weights.tensor_arena import TensorArena

    torch.set_num_threads(1)
    kernels.warm_up()
    old, new, _ = synthetic_model(params, lr, 1)
    staged = None  # both versions in arenas, as the trainer takes its snapshots for coders
    dense = sum(t.numel() * t.element_size() for t in new.values())
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="rose-gil-", dir=shm if relay_kind != "mooncake"
                                     else None) as tmp:
        if relay_kind == "mooncake":
            services = start_mooncake(Path(tmp))
            # a full first version and the deltas the publisher keeps behind the newest
            relay = MooncakeRelay(services.master_addr, services.metadata_url,
                                  segment_bytes=2 * dense + (256 << 20),
                                  local_buffer_bytes=64 << 20)
        else:
            services, relay = None, FilesystemRelay(Path(tmp) / "relay")
        try:
            conn.send("ready")
            while (msg := conn.recv()) is not None:
                workers, seconds, processes = msg
                pub = SparsePublisher(relay, f"gil-{workers}-{processes}", link_gbps=gbps,
                                      workers=workers, coder_processes=workers * processes)
                if pub.coders is not None and not pub.coders.ready(120):
                    raise RuntimeError(f"coder processes: {pub.coders.failed}")
                if processes and staged is None:
                    staged = TensorArena.of(old), TensorArena.of(new)
                v0, v1 = staged if processes else (old, new)
                pub.publish(0, v0, copy=False)
                conn.send("go")
                walls, end = [], time.perf_counter() + seconds
                cpu0 = time.process_time(), _coders_cpu_s(pub)
                while time.perf_counter() < end:
                    version = len(walls) + 1
                    t = time.perf_counter()
                    report = pub.publish(version, v1 if version % 2 else v0, copy=False)
                    walls.append(time.perf_counter() - t)
                relay.remove_prefix(f"rose/gil-{workers}-{processes}/")
                conn.send({"publishes": len(walls), "wall_s": sum(walls) / len(walls),
                           "cpu_s": (time.process_time() - cpu0[0]) / len(walls),
                           "coders_cpu_s": (_coders_cpu_s(pub) - cpu0[1]) / len(walls),
                           "pushed_mb": report.pushed_bytes / 1e6,
                           "coded_tensors": sum(t.encoding != "raw" for t in report.tensors),
                           "tensors": len(report.tensors)})
        finally:
            relay.close()
            if services is not None:
                services.stop()


def _coders_cpu_s(pub) -> float:
    """CPU seconds the publisher's coder processes used so far (0 without them)."""
    return 0.0 if pub.coders is None else pub.coders.cpu_s()


def measure(conn, pid: int, spy: str, workers: int, seconds: float, rate: int,
            processes: bool) -> dict:
    conn.send((workers, seconds + 4, processes))  # py-spy starts within a second or two of "go"
    conn.recv()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "gil.txt"
        subprocess.run([spy, "record", "--gil", "--nonblocking", "--rate", str(rate),
                        "--duration", str(int(seconds)), "--format", "raw", "-o", str(raw),
                        "--pid", str(pid)], check=True, capture_output=True)
        total, inclusive, leaves = holders(raw)
    row = conn.recv()
    held = total / (rate * int(seconds))
    per_publish = lambda n: n / rate / int(seconds) * row["wall_s"] * 1e3  # noqa: E731
    return {"workers": workers, "coders": "processes" if processes else "threads", **row, "gil_fraction": held,
            "gil_ms_per_publish": held * row["wall_s"] * 1e3,
            "top_functions_ms": {k: per_publish(v) for k, v in inclusive.most_common(25)},
            "top_lines_ms": {k: per_publish(v) for k, v in leaves.most_common(25)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=494e6, help="synthetic model size")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--gbps", type=float, default=10.0, help="link rate the tensors are chosen for")
    p.add_argument("--workers", type=int, nargs="+",
                   default=sorted({1, available_cores()}))
    p.add_argument("--seconds", type=float, default=20.0, help="sampled per worker count")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--relay", choices=("mooncake", "filesystem"), default="mooncake",
                   help="filesystem: in /dev/shm, no relay process beside the publisher (py-spy "
                        "counts a GIL holder's preempted time as held: busy cores inflate it)")
    p.add_argument("--coders", choices=("threads", "processes"), nargs="+", default=["threads"],
                   help="processes: each encoding thread hands its pieces to a coder process "
                        "(storage/weights/coder_processes.py); py-spy samples the publisher only")
    p.add_argument("--out", type=Path, default=RESULTS / "transfer_gil.json")
    args = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        sys.exit("bench/transfer/transfer_gil.py needs py-spy: .venv/bin/pip install py-spy (dev extra)")

    t0 = time.perf_counter()
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_publisher, daemon=True,
                                           args=(child, args.params, args.lr, args.gbps,
                                                 args.relay))
    proc.start()
    child.close()  # the publisher's end is its own: if it dies, recv() fails, never hangs
    try:
        if parent.recv() != "ready":
            raise RuntimeError("publisher process did not start")
        rows = [measure(parent, proc.pid, spy, w, args.seconds, args.rate, c == "processes")
                for w in args.workers for c in args.coders]
    finally:
        parent.send(None)
        proc.join(timeout=60)
    console = print_table(
        f"GIL held by one publish, {args.params / 1e6:.0f}M params, lr {args.lr:g}, chosen for "
        f"{args.gbps:g} Gbps (sender only, {args.relay} relay)",
        ("workers", "coders", "publishes", "wall s", "CPU s", "coders' CPU s", "GIL held",
         "GIL ms / publish", "MB coded", "coded / tensors"),
        [(str(r["workers"]), r["coders"], str(r["publishes"]), f"{r['wall_s']:.3f}",
          f"{r['cpu_s']:.3f}", f"{r['coders_cpu_s']:.3f}",
          f"{r['gil_fraction']:.1%}", f"{r['gil_ms_per_publish']:.0f}", f"{r['pushed_mb']:.1f}",
          f"{r['coded_tensors']}/{r['tensors']}") for r in rows])
    top = rows[-1]["top_lines_ms"]
    console.print(f"where the GIL was held at {rows[-1]['workers']} workers (ms per publish): "
                  + "; ".join(f"{k} {v:.1f}" for k, v in list(top.items())[:12]))
    write_result(args.out, "transfer_gil", args, t0, rows=rows)


if __name__ == "__main__":
    main()
