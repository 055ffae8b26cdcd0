"""The transfer bench's link (bench/transfer_e2e.py): puts paced to the emulated rate, and the
unpaced loopback's rate measured from one bucket-sized put, leaving nothing in the relay."""
from __future__ import annotations

import time

import numpy as np
import pytest

from bench.transfer_e2e import PacedRelay, bulk_gbps
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
