"""House rules no linter checks: small modules (one concept each)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 300
EXEMPT = {"tests", "bench", ".venv", ".rose"}  # test and benchmark scripts may run longer


def test_no_module_over_300_lines():
    long = []
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in EXEMPT or rel.parts[0].startswith("."):
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            long.append(f"{rel} ({lines})")
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"
