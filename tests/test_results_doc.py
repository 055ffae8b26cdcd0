"""docs/results.md (and the README's demo-runs table) is generated from the committed
bench/results JSON: a figure edited by hand, or a JSON rewritten by a bench without
regenerating the page, fails here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_results_page_is_what_the_committed_json_gives():
    done = subprocess.run([sys.executable, "-m", "bench.results_doc", "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "match the JSON" in done.stdout
