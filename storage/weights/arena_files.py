"""Where arena files live (storage/weights/tensor_arena.py) and the sweep of those whose
process is gone: a killed trainer cannot unlink its own, and they hold model-sized memory in
/dev/shm. No torch here: `rose down` sweeps after stopping the stack's workers.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import psutil

PREFIX = "rose-arena-"  # then the owner's pid, a dash and a random suffix


def arena_dir() -> str:
    return "/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()


def arena_path(directory: str | None = None) -> Path:
    """A new arena file's path, named by this process."""
    return Path(directory or arena_dir()) / f"{PREFIX}{os.getpid()}-{os.urandom(6).hex()}"


def sweep_dead(directory: str | None = None) -> int:
    """Unlink arena files whose owner process is gone; how many."""
    swept = 0
    for path in Path(directory or arena_dir()).glob(f"{PREFIX}*-*"):
        pid = path.name[len(PREFIX):].split("-")[0]
        if not pid.isdigit() or psutil.pid_exists(int(pid)):
            continue
        try:
            path.unlink()
            swept += 1
        except FileNotFoundError:
            pass
    return swept
