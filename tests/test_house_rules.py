"""House rules no linter checks: small modules (one concept each), nothing named outside the repo."""
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


def test_the_product_names_no_file_outside_the_repository():
    """A clone has no ../shared: what the product reads or cites ships inside the repository."""
    outside = []
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if (rel.parts[0] in EXEMPT or rel.parts[0].startswith(".") or not path.is_file()
                or path.suffix not in (".py", ".json", ".md", ".yaml", ".toml")):
            continue
        if "../shared" in path.read_text(encoding="utf-8", errors="ignore"):
            outside.append(str(rel))
    assert not outside, f"files naming ../shared: {outside}"
