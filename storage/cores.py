"""The cores this process may run on, for every pool that sizes itself by them (the tensor pool,
storage/weights/parallel.py; a large tensor's block threads, storage/delta/blocks.py)."""
from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity: engines pinned to one core get 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
