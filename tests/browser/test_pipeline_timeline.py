"""One-step off-policy in the Prefect UI: two rl_step flow runs overlapping on the train run's
timeline, drawn by the real UI in headless Chromium.

`rose train -c run.yaml` with max_staleness 1 (3 small steps) on a CLI stack; then, from
Prefect's API, step s+1's rollout task run starts before step s's train task run ends, and the
train flow run's page (its graph of subflow runs) renders. Deselected by default (marker
`browser`); run it with
    .venv/bin/pytest -m browser tests/browser/test_pipeline_timeline.py -s
ROSE_SCREENSHOT_DIR=docs/img keeps the screenshot there (the README's is taken this way).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.browser.webdriver import Browser, find_chromium
from tests.stack_fixtures import cli_stack_env, flow_runs, new_data_dir, prefect_for, rose_cli

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs chromium and chromium-driver "
                                 "(apt-get install chromium chromium-driver)")]
RUN = "pipeline-ui"


def _task(run, name: str):
    return next(t for t in run.tasks if t.name.rsplit("-", 1)[0] == name)


def test_ui_shows_two_steps_overlapping(tmp_path_factory, tmp_path):
    data = new_data_dir(tmp_path_factory, "rose-pipeline-ui")
    config = tmp_path / "run.yaml"
    config.write_text(f"run_id: {RUN}\nsteps: 3\nmax_staleness: 1\n"
                      "rollout: {groups: 8, group_size: 8, max_turns: 6}\n")
    with cli_stack_env(data) as env:
        out = rose_cli(["train", "-c", str(config)], env, timeout=900)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        from core.config import stack_dir
        from coordination.stack_record import load_stack

        handle = load_stack(stack_dir())
        with prefect_for(handle):
            steps = {s: flow_runs(f"{RUN}-step-{s}")[0] for s in (1, 2, 3)}
            for s in (2, 3):  # step s's rollout ran while step s-1 trained
                assert (_task(steps[s], "rollout").start_time
                        < _task(steps[s - 1], "train").end_time)
            [parent] = flow_runs(RUN)
            browser = Browser(*CHROMIUM)
            try:
                browser.open(f"{handle.prefect_ui_url}/runs/flow-run/{parent.run.id}")
                browser.wait_for_text(RUN, "Completed")
                time.sleep(3)  # the graph draws after the page's first paint
                shots = Path(os.environ.get("ROSE_SCREENSHOT_DIR", tmp_path))
                shot = browser.screenshot(shots / "pipeline-timeline.png")
            finally:
                browser.close()
    assert shot.stat().st_size > 10_000
    print("\nscreenshot:", shot)
