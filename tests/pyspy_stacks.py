"""py-spy's raw output (one 'thread;frame;frame;... count' line per sampled stack) read into
samples per function and per leaf line: how bench/transfer/transfer_gil.py tells who holds the GIL."""
from __future__ import annotations

from collections import Counter
from pathlib import Path


def holders(raw: Path) -> tuple[int, Counter, Counter]:
    """(samples, inclusive samples per function, samples per leaf line) of py-spy's raw
    output (one 'frame;frame;... count' line per stack)."""
    total, inclusive, leaves = 0, Counter(), Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")[1:]  # the first is the thread
        total += n
        for name in {f.split(" (")[0] for f in frames}:
            inclusive[name] += n
        if frames:
            leaf = frames[-1]
            where = leaf.split(" (")[-1].rstrip(")").rsplit("/", 1)[-1]
            leaves[f"{leaf.split(' (')[0]} ({where})"] += n
    return total, inclusive, leaves
