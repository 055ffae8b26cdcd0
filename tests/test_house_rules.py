"""House rules no linter checks: small modules (one concept each), nothing named outside the repo."""
from __future__ import annotations

import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Split modules by concept, not by a count: past WARN_LINES the suite says so (a warning in its
# summary, a hint to look), past MAX_LINES a module holds more than one concept and fails.
WARN_LINES, MAX_LINES = 300, 600
EXEMPT = {"tests", "bench", ".venv", ".rose"}  # test and benchmark scripts may run longer


def _module_lengths() -> dict[str, int]:
    out = {}
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in EXEMPT or rel.parts[0].startswith("."):
            continue
        out[str(rel)] = len(path.read_text(encoding="utf-8").splitlines())
    return out


def test_modules_stay_one_concept_long():
    lengths = _module_lengths()
    long = sorted(f"{rel} ({n})" for rel, n in lengths.items() if n > WARN_LINES)
    if long:
        warnings.warn(f"modules over {WARN_LINES} lines (one concept each?): {', '.join(long)}",
                      stacklevel=1)
    too_long = sorted(f"{rel} ({n})" for rel, n in lengths.items() if n > MAX_LINES)
    assert not too_long, f"modules over {MAX_LINES} lines (split them by concept): {too_long}"


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
