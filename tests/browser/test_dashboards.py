"""The browser dashboards in headless Chromium, against a stack that trained 2 steps while a
replay of the code trace drove its serving worker: each page opens, every plot holds data, and
a screenshot of each is saved.

Needs Debian's `chromium` and `chromium-driver`; skipped without them. Deselected by default
(marker `browser`); run it with
    .venv/bin/pytest -m browser tests/browser/test_dashboards.py -s
ROSE_DASHBOARD_DATA=<data dir> points it at data already recorded (no stack started);
ROSE_DASHBOARD_SHOTS=<dir> also copies the screenshots there (docs/img was made so).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rose.stack.ports import free_port
from tests.browser.webdriver import Browser, find_chromium
from tests.stack_fixtures import REPO, cli_stack_env, new_data_dir, rose_cli

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs chromium and chromium-driver "
                                 "(apt-get install chromium chromium-driver)")]
# Per page: titles (a prefix each) of plots that must be there and hold data.
PAGES = {"runs": ["Mean trajectory reward"],
         "serving": ["TTFT P99", "KV blocks, serving vs rollout", "Rollout admission per second"],
         "routing": ["Turns per worker", "Affinity hit rate"],
         "transfer": ["Bytes shipped", "Encoding mix", "Publish stages", "Policy version lag"]}
# Per plot of the page: its title and how many of its glyph renderers hold rows.
DRAWN = """
const doc = window.Bokeh && Bokeh.documents && Bokeh.documents[0];
if (!doc) return null;
const out = {};
for (const m of doc.all_models) {
  if (m.renderers === undefined || !m.title || m.title.text === undefined) continue;
  out[m.title.text] = m.renderers.filter(r => r.data_source && r.data_source.get_length() > 0).length;
}
return out;
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    given = os.environ.get("ROSE_DASHBOARD_DATA")
    if given:
        yield Path(given)
        return
    data = new_data_dir(tmp_path_factory, "rose-dashboards")
    (data / "small.yaml").write_text("rollout: {groups: 2, group_size: 4, max_turns: 3}\n")
    with cli_stack_env(data) as env:
        out = rose_cli(["demo", "--steps", "2", "-c", str(data / "small.yaml")], env, timeout=900)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        yield data


@pytest.fixture(scope="module")
def dashboard(data_dir):
    port = free_port()
    env = {**os.environ, "ROSE_DATA_DIR": str(data_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "rose.cli", "dashboard", "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/runs", trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def wait_drawn(browser: Browser, timeout: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        drawn = browser.script(DRAWN)
        if drawn and all(drawn.values()):
            return drawn
        assert time.monotonic() < deadline, f"plots without data: {drawn}"
        time.sleep(0.5)


def test_every_page_draws_data(dashboard, tmp_path):
    browser = Browser(*CHROMIUM)
    shots = []
    try:
        for page, titles in PAGES.items():
            browser.open(f"{dashboard}/{page}")
            drawn = wait_drawn(browser)  # Bokeh draws in shadow DOM and canvas: ask BokehJS
            assert all(any(t.startswith(title) for t in drawn) for title in titles), drawn
            # the whole page in the screenshot: as tall as what Bokeh laid out
            height = browser.script("return document.documentElement.scrollHeight") or 0
            browser.resize(1400, max(1000, int(height) + 140))
            time.sleep(1)  # let the canvases paint
            shots.append(browser.screenshot(tmp_path / f"dashboard-{page}.png"))
    finally:
        browser.close()
    if os.environ.get("ROSE_DASHBOARD_SHOTS"):
        for shot in shots:
            shutil.copy(shot, Path(os.environ["ROSE_DASHBOARD_SHOTS"]) / shot.name)
    print("\nscreenshots:", *map(str, shots))
