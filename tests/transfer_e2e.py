"""End-to-end publish-to-applied time through a real Mooncake relay, with an emulated link.

Link emulation (a token bucket on the push side, depth 0): each relay put of n bytes returns
no earlier than n * 8 / rate seconds after the previous put's bytes left, so the sender never
exceeds `rate` (1, 10, 25, 100 Gbps by default) and a put that is really slower than the link
keeps its real time. Reads are not paced: the receiver is a second process, its relay a client
of the stack's store client as `rose up` opens it (memory shared with it; `--own-segments`:
the layout before, gets over loopback TCP). This stands in for a cross-cluster link to a relay
beside the receivers; it is not a measurement of one. Rate 0 is unpaced loopback: as fast as
the relay goes on this machine. Its rate, for ours' time model and the model column, is the
relay's bulk rate measured once in the run (one bucket put, best of 3): a small workload's
push time is mostly fixed per-publish costs, not bandwidth, and would understate the link.

Per workload and rate, two ways to move version v1 to a receiver that holds v0:
  dense   the dense batch baseline (RollArt-style relay): raw bf16 of every tensor in 64 MB
          buckets (storage.weights.publisher.publish_weights), pulled in 1 GB batches; v0 is
          published (untimed) first, so the relay holds what it holds for ours
  ours    storage.weights.sparse_publisher: per-tensor lossless deltas against v0 (published and
          pulled untimed first), pulled and applied by storage.weights.receiver, each tensor
          coded or raw by the time model (storage/delta/time_model.py) at this host's probed
          coding speed (storage/delta/host_speed.py) and the link's rate as v0's transfers
          measured it: its paced puts and the receiver's gets (storage/weights/link_rate.py;
          the row's rate for a workload under 16 MB, which is not measured): as `rose train`;
          encoded and decoded on every core; when the version is a coded delta the receiver
          is told before the push and applies it bucket by bucket as it lands
          (storage/weights/stream_pull.py), else once it is complete, as dense's is (both as
          `rose train`'s publish task does)
Time = sender (encode + paced push) + receiver (fetch + apply + checksums), measured as wall
time from the start of the publish to the receiver's answer; every receiver checks the whole
set's digest against the trainer's. Each row also gives the issue's time model of a pipelined
publish, max(bytes / rate, sender CPU s / cores, receiver CPU s / cores), with the CPU seconds
of each process (all threads) measured over the run; and that model with both processes'
CPU seconds on the same cores, max(bytes / rate, (sender + receiver CPU s) / cores), which is
how they run on one machine. With `reader_cores` (python -m bench.transfer.transfer --split-cores) the two
processes run on cores of their own, as two hosts would: the issue's model is then the one that
applies, with each side's own cores, and the shared model is set equal to it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import statistics
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import torch

from storage.delta import host_speed, kernels
from storage.delta.time_model import Link, pipelined_s
from storage.relay.base import Buffer, Relay
from storage.cores import available_cores

GBPS = 1e9 / 8  # bytes per second in one Gbit/s


class PacedRelay(Relay):
    """`inner` with puts paced to `gbps` (see the module docstring); everything else as is."""

    def __init__(self, inner: Relay, gbps: float) -> None:
        if gbps <= 0:
            raise ValueError(f"rate must be > 0 Gbps, got {gbps}")
        self.inner, self.rate = inner, gbps * GBPS
        self.name = f"{inner.name}@{gbps:g}Gbps"
        self.link_free = 0.0
        self.bytes = 0

    def put(self, key: str, data: Buffer) -> None:
        n = memoryview(data).nbytes
        done_at = max(time.perf_counter(), self.link_free) + n / self.rate
        self.inner.put(key, data)
        self.bytes += n
        left = done_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
        self.link_free = done_at

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_many(self, keys: Sequence[str]) -> list[memoryview]:
        return self.inner.get_many(keys)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        return self.inner.exists_many(keys)

    def remove(self, key: str) -> bool:
        return self.inner.remove(key)

    def remove_prefix(self, prefix: str) -> int:
        return self.inner.remove_prefix(prefix)


def pin_threads(cores: Collection[int]) -> None:
    """Run every thread of this process on `cores`, and what it starts later (threads and
    processes inherit their creator's affinity); an affinity set with pid 0 is the calling
    thread's alone, so each thread already running is pinned by its id."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def _reader(conn, master: str, metadata: str, batch_bytes: int,
            cores: Collection[int] | None = None, client_addr: str | None = None) -> None:
    """Receiver process: ("dense"|"sparse"|"drop", run, version) -> (seconds, stats, digest);
    its relay a client of the store client at `client_addr` when given (as `rose up`'s)."""
    if cores:
        pin_threads(cores)  # before any pool or relay thread exists
    torch.set_num_threads(1)
    from storage.relay.mooncake import MooncakeRelay
    from storage.weights.digest import tensors_digest
    from storage.weights.apply_pipeline import pull_weights
    from storage.weights.receiver import WeightReceiver

    kernels.warm_up()  # a long-lived receiver has its codec kernels compiled
    relay = MooncakeRelay(master, metadata, segment_bytes=0, local_buffer_bytes=64 << 20,
                          client_addr=client_addr)
    receivers: dict[str, WeightReceiver] = {}
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        op, run, version = msg
        t, cpu = time.perf_counter(), time.process_time()
        if op == "dense":
            stats: dict = {}
            _, tensors = pull_weights(relay, run, version, batch_bytes, stats=stats)
            digest = tensors_digest(tensors)
            stats["digest_s"] = time.perf_counter() - t - stats["fetch_s"] - stats["decode_s"]
            stats["cpu_s"] = time.process_time() - cpu
            conn.send((time.perf_counter() - t, stats, digest))
        elif op in ("sparse", "stream"):  # stream: started before the publish, as rose train
            rx = receivers.setdefault(run, WeightReceiver(relay, run, "bench-reader",
                                                          batch_bytes, full_timeout_s=60))
            report = rx.pull(version, await_s=120.0 if op == "stream" else 0.0)
            conn.send((time.perf_counter() - t, {**report.as_dict(),
                                                 "cpu_s": time.process_time() - cpu}, rx.digest))
        else:
            receivers.pop(run, None)
            conn.send((0.0, {}, ""))
    relay.close()


def start_relay(tmp: Path, held_bytes: int, own_segments: bool = False):
    """(Mooncake services, the writer's relay) as `rose up` opens them: a store client holding
    `held_bytes`, this process a client of it (its address in services.client_addr); with
    `own_segments`, no store client and the writer's own segment holds them (the layout before
    the stack ran a store client; gets cross loopback TCP)."""
    from rose.stack.mooncake import start_mooncake
    from storage.relay.mooncake import MooncakeRelay

    services = start_mooncake(tmp, store_mb=0 if own_segments else (held_bytes >> 20) + 1)
    if not own_segments and not services.client_addr:
        services.stop()
        raise RuntimeError(f"the Mooncake store client did not start: {services.client_error}")
    try:
        writer = MooncakeRelay(services.master_addr, services.metadata_url,
                               segment_bytes=held_bytes if own_segments else 0,
                               local_buffer_bytes=64 << 20, client_addr=services.client_addr)
    except BaseException:
        services.stop()
        raise
    return services, writer


def bulk_gbps(writer: Relay, nbytes: int, tries: int = 3) -> float:
    """The relay's unpaced put rate for one `nbytes` object (best of `tries`): the loopback
    link's bandwidth, as an operator would measure it to set `publish.link_gbps`."""
    data = torch.ones(nbytes, dtype=torch.uint8).numpy()  # touched: no page faults timed
    best = float("inf")
    for i in range(tries):
        key = f"bench-bulk/{i}"
        t = time.perf_counter()
        writer.put(key, data)
        best = min(best, time.perf_counter() - t)
        writer.remove(key)
    return nbytes * 8 / 1e9 / best


def _link(writer: Relay, rate: float) -> Relay:
    return PacedRelay(writer, rate) if rate > 0 else writer  # 0: unpaced loopback


def _dense_once(writer: Relay, conn, run: str, new: dict, rate: float, bucket_bytes: int,
                want: str) -> dict:
    from storage.weights.publisher import publish_weights

    publish_weights(writer, run, 0, new, bucket_bytes)  # untimed: the relay holds v0, as for ours
    conn.send(("dense", run, 0))  # and the receiver pulled it, as ours' did its base
    conn.recv()
    t0, cpu = time.perf_counter(), time.process_time()
    stats = publish_weights(_link(writer, rate), run, 1, new, bucket_bytes)
    sender_cpu = time.process_time() - cpu
    t1 = time.perf_counter()
    conn.send(("dense", run, 1))
    pull_s, pstats, digest = conn.recv()
    t2 = time.perf_counter()
    writer.remove_prefix(f"rose/{run}/")
    if digest != want:
        raise AssertionError(f"dense pull of {run} is not bit-exact")
    return {"method": "dense", "bytes": stats.bytes, "publish_s": t1 - t0,
            "encode_s": stats.serialize_s, "push_s": stats.push_s, "pull_s": pull_s,
            "fetch_s": pstats["fetch_s"], "apply_s": pstats["decode_s"] + pstats["digest_s"],
            "sender_cpu_s": sender_cpu, "receiver_cpu_s": pstats["cpu_s"], "total_s": t2 - t0}


def _ours_once(writer: Relay, conn, run: str, old: dict, new: dict, rate: float,
               bucket_bytes: int, want: str, link_gbps: float, raw_samples=None,
               coder_processes: int = 0) -> dict:
    from storage.weights.link_rate import LinkRate
    from storage.weights.sparse_publisher import SparsePublisher

    # as `rose train`'s publisher: the link as its transfers measure it (`link_gbps` until
    # then), coding costed at this host's probed speed
    pub = SparsePublisher(_link(writer, rate), run, bucket_bytes, link_gbps=link_gbps,
                          link_rate=LinkRate(), measure_cpu=True, raw_samples=raw_samples,
                          coder_processes=coder_processes)
    coders = pub.coders
    if coders is not None and not coders.ready(120):
        raise RuntimeError(f"coder processes: {coders.failed}")
    pub.publish(0, old, copy=False)  # the receiver's base, untimed: its puts measure the link
    conn.send(("sparse", run, 0))
    _, base_pull, _ = conn.recv()
    pub.observe_gets(base_pull["get_bytes"], base_pull["get_s"])  # and the receiver's gets
    t0, cpu = time.perf_counter(), time.process_time() + (coders.cpu_s() if coders else 0.0)
    streams = pub.streams(1, new)  # as tasks/publish.py: a streamed delta is waited for
    if streams:
        conn.send(("stream", run, 1))
    report = pub.publish(1, new, copy=False)  # as the trainer: fresh tensors, not copied
    t1 = time.perf_counter()
    sender_cpu = time.process_time() + (coders.cpu_s() if coders else 0.0) - cpu
    if not streams:  # pulled once complete, as the dense path is
        conn.send(("sparse", run, 1))
    pull_s, pull, digest = conn.recv()
    t2 = time.perf_counter()
    writer.remove_prefix(f"rose/{run}/")
    conn.send(("drop", run, 0))
    conn.recv()
    if digest != want or pull["mode"] != "delta":
        raise AssertionError(f"sparse pull of {run}: mode {pull['mode']}, "
                             f"bit-exact {digest == want}")
    return {"method": "ours", "bytes": report.pushed_bytes, "publish_s": t1 - t0,
            "encode_s": report.encode_s, "push_s": report.push_s, "pull_s": pull_s,
            "fetch_s": pull["fetch_s"], "apply_s": pull["apply_s"], "sender_cpu_s": sender_cpu,
            "receiver_cpu_s": pull["cpu_s"], "total_s": t2 - t0,
            "streamed_buckets": pull["streamed"], "buckets": pull["buckets"],
            "polls": pull["polls"],  # the receiver's relay checks while it streamed
            "raw_tensors": sum(t.encoding == "raw" for t in report.tensors),
            "chosen_gbps": report.link_gbps,  # the link rate its tensors were chosen by
            "tensors": len(report.tensors), "coder_processes": coder_processes}


def _with_model(row: dict, gbps: float, split: bool = False) -> dict:
    """The row with the pipelined time model at `gbps` and measured / model, twice: the
    issue's model, where sender and receiver each have this process's cores, and the same
    with their CPU seconds sharing those cores, as they do on one machine unless `split` gave
    each its own (then the two are the same)."""
    link = Link(gbps, available_cores())
    model = pipelined_s(row["bytes"], row["sender_cpu_s"], row["receiver_cpu_s"], link)
    shared = model if split else max(model, (row["sender_cpu_s"] + row["receiver_cpu_s"])
                                     / link.cores)
    return {**row, "model_gbps": gbps, "model_s": model, "over_model": row["total_s"] / model,
            "shared_model_s": shared, "over_shared_model": row["total_s"] / shared}


def median_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of `values`: whether a paired median
    under 1 is a difference or this machine's noise (on a few pairs, it is their range)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    tail = int((1 - level) / 2 * resamples)
    return medians[tail], medians[resamples - 1 - tail]


def run_e2e(workloads: list[tuple[str, dict, dict]], rates_gbps: Sequence[float],
            bucket_bytes: int = 64 << 20, batch_bytes: int = 1 << 30, repeat: int = 1,
            log=print, small_repeat: int = 31,
            reader_cores: Collection[int] | None = None,
            own_segments: bool = False, coder_processes: int = 0) -> list[dict]:
    """Rows of (workload, rate, method), the best of `repeat` runs by total time (this machine
    is shared: the best run is the least disturbed one), or of `small_repeat` for a workload
    under one bucket (tens of ms, where a disturbance is as large as the difference measured).
    Dense and ours run back to back, alternating which goes first; ours' row also carries the
    median over those pairs of dense / ours (`paired_median_speedup`). With `reader_cores`,
    the receiver runs on those cores and the caller should already run on others. See the
    module docstring. `own_segments`: the relay's layout before the stack's store client
    (start_relay). `coder_processes`: ours codes in that many processes
    (storage/weights/coder_processes.py), its versions in arenas as the trainer's snapshots
    are then (sender CPU counts theirs)."""
    from storage.weights.digest import tensors_digest
    from storage.weights.tensor_arena import TensorArena
    from storage.weights.tensor_form import RawSamples

    kernels.warm_up()  # as a long-lived trainer has: not a cost of any one publish
    host_speed.measured()  # and its coding speed, probed at its first delta: not timed here
    dense_max = max(sum(t.numel() * t.element_size() for t in new.values())
                    for _, _, new in workloads)
    rows: list[dict] = []
    split = bool(reader_cores)  # sender and receiver on cores of their own
    with tempfile.TemporaryDirectory(prefix="rose-bench-mc-") as tmp:
        # room for a full v0 and a dense v1 at once, plus bucket rounding
        services, writer = start_relay(Path(tmp), 2 * dense_max + 4 * bucket_bytes + (64 << 20),
                                       own_segments)
        proc = None
        parent, child = mp.get_context("spawn").Pipe()
        try:
            proc = mp.get_context("spawn").Process(
                target=_reader, args=(child, services.master_addr, services.metadata_url,
                                      batch_bytes, reader_cores, services.client_addr),
                daemon=True)
            proc.start()
            child.close()  # the reader's end is its own: if it dies, recv() fails, never hangs
            if parent.recv() != "ready":
                raise RuntimeError("reader process did not start")
            loopback_gbps = bulk_gbps(writer, bucket_bytes) if 0 in rates_gbps else 0.0
            if loopback_gbps:
                log(f"  unpaced loopback: the relay puts a {bucket_bytes >> 20} MB bucket at "
                    f"{loopback_gbps:.1f} Gbps (the link rate of its rows)")
            for w, (label, old, new) in enumerate(workloads):
                want = tensors_digest(new)
                if coder_processes:  # as the trainer takes its snapshots for coders: untimed
                    old, new = TensorArena.of(old), TensorArena.of(new)
                small = sum(t.numel() * t.element_size() for t in new.values()) < bucket_bytes
                for rate in rates_gbps:
                    runs = []
                    gbps = rate or loopback_gbps
                    # as rose train's one publisher keeps its judge's samples over the run
                    samples = RawSamples()
                    for i in range(max(repeat, small_repeat) if small else repeat):
                        dense_run = (writer, parent, f"bench-d{w}-{rate:g}-{i}", new, rate,
                                     bucket_bytes, want)
                        ours_run = (writer, parent, f"bench-o{w}-{rate:g}-{i}", old, new, rate,
                                    bucket_bytes, want, gbps, samples, coder_processes)
                        # alternate which goes first: neither always follows the other's pull
                        if i % 2:
                            o = _ours_once(*ours_run)
                            d = _dense_once(*dense_run)
                        else:
                            d = _dense_once(*dense_run)
                            o = _ours_once(*ours_run)
                        runs.append((_with_model(d, gbps, split), _with_model(o, gbps, split)))
                    dense = min((d for d, _ in runs), key=lambda r: r["total_s"])
                    ours = min((o for _, o in runs), key=lambda r: r["total_s"])
                    # each pair ran back to back: the median of their ratios shrugs off a
                    # disturbance that hit one pair, where the two bests may come from two
                    ratios = [d["total_s"] / o["total_s"] for d, o in runs]
                    paired, (low, high) = statistics.median(ratios), median_ci(ratios)
                    for row in (dense, ours):
                        rows.append({"workload": label, "gbps": rate, "repeat": len(runs), **row})
                    rows[-1].update(paired_median_speedup=paired, paired_ci95=[low, high])
                    log(f"  e2e {label} @ {rate or 'unpaced'} Gbps: dense {dense['total_s']:.2f} s, "
                        f"ours {ours['total_s']:.2f} s ({dense['total_s'] / ours['total_s']:.1f}x; "
                        f"median of {len(runs)} back-to-back pairs {paired:.2f}x, "
                        f"95% CI {low:.2f}-{high:.2f})")
        finally:
            if proc is not None and proc.is_alive():
                parent.send(None)
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()
            writer.close()
            services.stop()
    return rows
