"""The link rate a publisher chooses by: the configured one until the transfers measure it.

The time model (storage/delta/time_model.py) needs the rate at which bytes go from the trainer
to the engines; `publish.link_gbps` is what the operator expects it to be. What counts is what
the relay's transfers achieve, on two legs: the trainer's bucket puts and the engines' bucket
gets (with the store beside the trainer, the gets are what crosses clusters; with it beside
the engines, the puts). Each side times its transfers with a `TransferClock`: the bytes moved
and the wall time some transfer was under way, so gets that run at once and share the link
count their time once, and time spent waiting between transfers (a streamed pull waiting for
the next bucket) does not count. `LinkRate` keeps, per leg, the rates of the last WINDOW
measurements of at least MIN_BYTES (a smaller one is mostly per-request latency, not
bandwidth: the demo's 1.7 MB policy is never measured) and chooses by the slower leg's
median; a leg not measured yet counts as the configured rate. Plain Python: no relay inside.
"""
from __future__ import annotations

import statistics
import threading
from collections import deque

MIN_BYTES = 16 << 20  # ~1.3 ms at 100 Gbps: a request's ~0.1-0.3 ms latency stays minor
WINDOW = 8  # measurements kept per leg: recent enough to follow a link that changes
LEGS = ("put", "get")


class TransferClock:
    """Bytes moved and the wall time some transfer was under way (the union of the
    transfers' intervals), added to from any number of threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0
        self._spans: list[tuple[float, float]] = []

    def __getstate__(self) -> dict:
        """Picklable (a pull's stats cross process pipes): its totals, not its lock."""
        with self._lock:
            return {"bytes": self.bytes, "spans": list(self._spans)}

    def __setstate__(self, state: dict) -> None:
        self._lock = threading.Lock()
        self.bytes, self._spans = state["bytes"], state["spans"]

    def add(self, nbytes: int, start: float, end: float) -> None:
        """One transfer of `nbytes` from `start` to `end` (time.perf_counter seconds)."""
        if end < start:
            raise ValueError(f"a transfer cannot end ({end}) before it starts ({start})")
        with self._lock:
            self.bytes += nbytes
            self._spans.append((start, end))

    @property
    def seconds(self) -> float:
        """Wall seconds during which at least one transfer was under way."""
        with self._lock:
            spans = sorted(self._spans)
        total, reach = 0.0, float("-inf")
        for start, end in spans:
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total


class LinkRate:
    """Measured rates of the put and get legs; see the module docstring."""

    def __init__(self, min_bytes: int | None = None, window: int = WINDOW) -> None:
        min_bytes = MIN_BYTES if min_bytes is None else min_bytes  # (read now: tests lower it)
        if min_bytes < 1 or window < 1:
            raise ValueError(f"min_bytes and window must be >= 1, got {min_bytes}, {window}")
        self.min_bytes = min_bytes
        self._rates: dict[str, deque[float]] = {leg: deque(maxlen=window) for leg in LEGS}
        self._lock = threading.Lock()

    def observe(self, leg: str, nbytes: int, seconds: float) -> bool:
        """Count one measurement of `leg` ("put" or "get"): `nbytes` moved in `seconds` of
        transfer; False when it is too small to tell the bandwidth (not counted)."""
        if leg not in LEGS:
            raise ValueError(f"leg must be one of {LEGS}, got {leg!r}")
        if nbytes < self.min_bytes or not seconds > 0:
            return False
        with self._lock:
            self._rates[leg].append(nbytes * 8 / seconds / 1e9)
        return True

    def leg_gbps(self, leg: str) -> float | None:
        """The median of the leg's last measurements, None before any."""
        with self._lock:
            rates = list(self._rates[leg])
        return statistics.median(rates) if rates else None

    def gbps(self, configured: float) -> float:
        """The rate to choose by: the slower leg, a leg not measured yet at `configured`."""
        measured = (self.leg_gbps(leg) for leg in LEGS)
        return min(configured if rate is None else rate for rate in measured)

    def as_dict(self) -> dict[str, float | None]:
        """Each leg's measured rate in Gbps (None: not measured yet)."""
        return {f"{leg}_gbps": self.leg_gbps(leg) for leg in LEGS}
