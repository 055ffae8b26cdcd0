"""Arenas (storage/weights/tensor_arena.py) where shared memory has no room for them: a clear
error naming the room, never a SIGBUS at the first write past it (what an unreserved tmpfs file
gives), no file left behind, and a publisher with coder processes on that codes on its own
threads instead, bit-exact. Real, not mocked: the child runs in a mount namespace
(unshare -Urm) whose /dev/shm is a 1 MiB tmpfs, as a container's is small."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from small_shm import run_in_small_shm

CHILD = Path(__file__).with_name("arena_space_child.py")


def _in_small_shm() -> dict:
    run = run_in_small_shm(f"exec {sys.executable} {CHILD}", "1m")
    assert run.returncode == 0, f"rc {run.returncode}:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_arenas_without_room_fall_back_to_threads_bit_exact():
    seen = _in_small_shm()
    # an arena that does not fit: a clear error naming the room and the way out, no file left
    assert seen["error"] is not None
    assert "/dev/shm has 1.0 MiB free, an arena of 2.0 MiB does not fit" in seen["error"]
    assert "--shm-size" in seen["error"] and "coder_processes: 0" in seen["error"]
    assert not [f for f in seen["left_in_shm"] if f.startswith("rose-arena-")]
    # arena_copy: none (the caller keeps its tensors its usual way), as a trainer's snapshot
    assert seen["arena_copies"] == [None, None]
    assert seen["snapshot_equal"] and not seen["snapshot_in_arena"]
    # said once in the log however many times it did not fit (two copies, a trainer's
    # snapshot, two publishes)
    assert len(seen["warnings"]) == 1 and "does not fit" in seen["warnings"][0]
    # coder processes on, no arena: the publisher coded on its threads, bit-exact
    assert seen["digests_match"] and seen["received_equal"]
