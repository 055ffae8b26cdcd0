"""The real Prefect UI in headless Chromium: deployments listed, the run form, a Completed run.

Needs Debian's `chromium` and `chromium-driver` (apt-get install chromium chromium-driver);
skipped without them. Deselected by default (marker `browser`); run it with
    .venv/bin/pytest -m browser tests/browser -s
Screenshots land in the test's tmp dir (their paths are printed).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.browser.webdriver import Browser, find_chromium
from tests.stack_fixtures import cli_stack_env, new_data_dir, prefect_for, rose_cli

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs chromium and chromium-driver "
                                 "(apt-get install chromium chromium-driver)")]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    data = new_data_dir(tmp_path_factory, "rose-browser")
    with cli_stack_env(data) as env:
        out = rose_cli(["deploy"], env, timeout=400)
        assert out.returncode == 0, out.stderr[-2000:]
        from core.config import stack_dir
        from coordination.stack_record import load_stack

        handle = load_stack(stack_dir())
        with prefect_for(handle):
            yield handle


@pytest.fixture
def browser():
    b = Browser(*CHROMIUM)
    try:
        yield b
    finally:
        b.close()


def test_ui_lists_deployments_shows_form_and_a_completed_run(deployed, browser, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    ui = deployed.prefect_ui_url
    browser.open(f"{ui}/deployments")
    browser.wait_for_text("train", "rl-step", "benchmarks", "serving-replay")
    shots = [browser.screenshot(tmp_path / "deployments.png")]

    async def train_id():
        async with get_client() as client:
            return (await client.read_deployment_by_name("train/train")).id

    browser.open(f"{ui}/deployments/deployment/{await_(train_id())}/run")
    browser.wait_for_text("Run Id", "Steps", "Rollout", "Group Size")  # RunConfig as a form
    shots.append(browser.screenshot(tmp_path / "run-form.png"))

    params = {"cfg": {"run_id": "ui-check", "steps": 1,
                      "rollout": {"groups": 2, "group_size": 4, "max_turns": 3}}}
    run = run_deployment("train/train", parameters=params, timeout=900, poll_interval=1)
    assert run.state.is_completed(), run.state
    browser.open(f"{ui}/runs/flow-run/{run.id}")
    browser.wait_for_text("ui-check", "Completed")
    time.sleep(2)  # the run page re-renders after its first paint: let the shot show it
    browser.wait_for_text("ui-check", "Completed")
    shots.append(browser.screenshot(tmp_path / "flow-run.png"))
    print("\nscreenshots:", *map(str, shots))


def await_(coro):
    return asyncio.run(coro)
