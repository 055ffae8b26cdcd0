"""A command run as in a container with a small /dev/shm: in a mount namespace (unshare -Urm)
whose /dev/shm is a fresh tmpfs of the given size. The real limit, not a mock; the test that
asks is skipped, saying why, where no mount namespace can be made."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_in_small_shm(command: str, size: str, env: dict[str, str] | None = None,
                     timeout: float = 600) -> subprocess.CompletedProcess:
    """`command` (a shell line) with /dev/shm a `size` tmpfs (e.g. "2m"), from the repository."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a mount namespace with a small /dev/shm")
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm || exit 77; {command}"
    run = subprocess.run(["unshare", "-Urm", "sh", "-c", script], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=timeout)
    if run.returncode == 77 or run.returncode != 0 and "unshare:" in run.stderr:
        pytest.skip(f"no mount namespace here: {run.stderr.strip()[-300:]}")
    return run
