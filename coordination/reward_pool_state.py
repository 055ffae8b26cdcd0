"""The elastic reward pool's state as its controller (rose/stack/reward_pool.py) records it in
<stack dir>/reward_pool.json: its workers and each scale-up's request and registration, for the
runs' reward service and `rose status`.
"""
from __future__ import annotations

import json
from pathlib import Path

STATE_FILE = "reward_pool.json"


def read_pool_state(run_dir: Path) -> dict | None:
    """The controller's record (None: no reward pool on this stack)."""
    try:
        return json.loads((Path(run_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
