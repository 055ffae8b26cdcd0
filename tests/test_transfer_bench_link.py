"""The transfer bench's link (tests/transfer_e2e.py): puts paced to the emulated rate, and the
unpaced loopback's rate measured from one bucket-sized put, leaving nothing in the relay; and
--split-cores' pinning of every thread; the interval around a paired median."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from tests.transfer_e2e import PacedRelay, bulk_gbps, median_ci, pin_threads
from storage.relay.filesystem import FilesystemRelay


def test_paced_puts_never_beat_the_link(tmp_path):
    relay = PacedRelay(FilesystemRelay(tmp_path), gbps=0.08)  # 10 MB/s
    data = np.ones(200_000, np.uint8)
    t = time.perf_counter()
    for i in range(3):
        relay.put(f"k{i}", data)
    assert time.perf_counter() - t >= 3 * 200_000 / 10e6 * 0.99
    assert bytes(relay.get("k2")) == data.tobytes()
    with pytest.raises(ValueError, match="rate"):
        PacedRelay(FilesystemRelay(tmp_path), 0)


def test_loopback_rate_is_measured_and_cleaned_up(tmp_path):
    relay = FilesystemRelay(tmp_path)
    gbps = bulk_gbps(relay, 4 << 20, tries=2)
    assert 0 < gbps < 10_000
    assert not relay.exists("bench-bulk/0") and not relay.exists("bench-bulk/1")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell apart")
def test_split_cores_pins_threads_already_running_and_started_later():
    """--split-cores: an affinity set by pid 0 is the calling thread's alone, so a pool thread
    started before the pin would run anywhere; pin_threads reaches it, and later ones inherit."""
    before = os.sched_getaffinity(0)
    one = {min(before)}
    started, release = threading.Event(), threading.Event()
    seen: dict[str, set[int]] = {}

    def early() -> None:
        started.set()
        release.wait(10)
        seen["early"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=early)
    thread.start()
    started.wait(10)
    try:
        pin_threads(one)
        later = threading.Thread(target=lambda: seen.update(later=os.sched_getaffinity(0)))
        later.start()
        later.join()
        release.set()
        thread.join()
        assert seen == {"early": one, "later": one} and os.sched_getaffinity(0) == one
    finally:
        release.set()
        pin_threads(before)


def test_paired_median_interval_tells_noise_from_a_difference():
    rng = np.random.default_rng(0)
    slower = list(0.95 + rng.normal(0, 0.01, 61))  # ours clearly slower: interval below 1
    noisy = list(1.0 + rng.normal(0, 0.1, 61))  # no difference, much noise: interval spans 1
    low, high = median_ci(slower)
    assert low <= float(np.median(slower)) <= high < 1.0
    low, high = median_ci(noisy)
    assert low < 1.0 < high and high - low > 0.02
    assert median_ci(noisy) == median_ci(noisy)  # seeded: a file's interval can be recomputed


@pytest.mark.slow
def test_the_end_to_end_bench_runs_dense_and_ours_through_mooncake():
    """bench/transfer/transfer.py's end-to-end rows on a tiny model, unpaced: both methods reach a
    receiver process bit-exactly (each checks the digest) and their answers cross the pipe
    (a pull's stats once held a clock that could not)."""
    import torch

    from tests.transfer_e2e import run_e2e

    g = torch.Generator().manual_seed(0)
    old = {f"model.layers.{i}.mlp.up_proj.weight":
           torch.randn(256, 256, generator=g).to(torch.bfloat16) for i in range(3)}
    new = {n: (t.float() * 1.01).to(torch.bfloat16) for n, t in old.items()}
    rows = run_e2e([("tiny", old, new)], [0], small_repeat=1, log=lambda *_: None)
    assert [r["method"] for r in rows] == ["dense", "ours"]
    assert all(r["total_s"] > 0 and r["bytes"] > 0 for r in rows)
    assert rows[0]["bytes"] >= sum(t.numel() * 2 for t in new.values())
