"""The run and stack configuration: one definition per knob, moved keys still load, the
co-serving executor's settings reachable from a config file, one-line errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.config import RunConfig, SchedulerConfig
from rose.config_file import ConfigError, load_run_config


def _write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_the_rollout_config_is_the_schedulers_config():
    cfg = RunConfig(rollout={"heartbeat_s": 0.2, "routing": "pinned", "stuck_after_s": 60})
    assert isinstance(cfg.rollout, SchedulerConfig)  # the scheduler takes it as it is
    assert (cfg.rollout.heartbeat_s, cfg.rollout.routing, cfg.rollout.stuck_after_s) == (0.2, "pinned", 60)


def test_a_moved_key_still_loads_at_its_new_place(tmp_path):
    cfg = load_run_config(_write(tmp_path, "publish:\n  max_staleness: 3\n"))
    assert cfg.rollout.serving_lag == 3
    with pytest.raises(ConfigError, match="^publish.max_staleness is now rollout.serving_lag"):
        load_run_config(_write(tmp_path, "publish: {max_staleness: 3}\nrollout: {serving_lag: 2}\n"))


def test_coserving_settings_reach_every_serving_worker(tmp_path):
    from executors.coserving.registration import coserving_plugin

    cfg = load_run_config(_write(tmp_path, "stack:\n  serving_mode: prefix\n"
                                           "  coserving: {kv_blocks: 200, reserve_fraction: 0.3, lease_s: 5}\n"))
    plugin = coserving_plugin(cfg.models, cfg.stack)
    assert {k: plugin.config[k] for k in ("mode", "kv_blocks", "reserve_fraction", "lease_s")} == \
        {"mode": "prefix", "kv_blocks": 200, "reserve_fraction": 0.3, "lease_s": 5.0}
    assert plugin.start_parked  # no run holds a serving worker at `rose up`: its rollout engine parks
    kept = load_run_config(_write(tmp_path, "stack:\n  coserving: {park_at_start: false}\n"))
    assert not coserving_plugin(kept.models, kept.stack).start_parked
    # what the plugin builds on the serving worker (executors/coserving/plugin.py setup)
    from executors.coserving.config import CoServingConfig

    (tmp_path / "config.json").write_text("{}")
    executor_cfg = CoServingConfig(tmp_path, tmp_path, **plugin.config)
    assert (executor_cfg.mode, executor_cfg.kv_blocks, executor_cfg.lease_s) == ("prefix", 200, 5.0)
    assert executor_cfg.wiring.leases and not executor_cfg.wiring.admission


@pytest.mark.parametrize("text, message", [
    ("stack: {coserving: {kv_blocks: 10}}",
     "'stack.coserving' in run.yaml: kv_blocks=10 cannot hold one 2048-token request"),
    ("stack: {coserving: {high_watermark: 2}}",
     "bad config value for 'stack.coserving.high_watermark' in "),
    ("stack: {coserving: {kv_pool: 1}}", "unknown config key 'stack.coserving.kv_pool' in "),
    ("stack: {serving_mode: serving_only}", "bad config value for 'stack.serving_mode' in "),
    ("rollout: {routing: random}", "bad config value for 'rollout.routing' in "),
])
def test_a_bad_setting_is_one_line_naming_it(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_run_config(_write(tmp_path, text + "\n"))
    line = str(err.value).replace(str(tmp_path) + "/", "")
    assert message in line and "\n" not in line


def test_config_show_says_where_each_value_came_from(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rose.cli import app

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path / "data"))
    path = _write(tmp_path, "steps: 3\nrollout: {groups: 4}\npublish: {max_staleness: 2}\n")
    out = CliRunner().invoke(app, ["config", "show", "-c", str(path), "--set", "rollout.groups=2"])
    assert out.exit_code == 0, out.output
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in out.output.splitlines()}
    assert rows["steps"] == "file 3"
    assert rows["rollout.groups"] == "flag 2"  # the flag wins over the file
    assert rows["rollout.serving_lag"] == "file (publish.max_staleness) 2"
    assert rows["rollout.heartbeat_s"] == "default 0.5"
    assert rows["stack.coserving.kv_blocks"] == "default None"
    assert rows["data_dir"] == f"env (ROSE_DATA_DIR) {tmp_path / 'data'}"
    assert rows["models.policy_dir"] == f"default {tmp_path / 'data' / 'models' / 'policy'}"
    bad = CliRunner().invoke(app, ["config", "show", "--set", "rollout.gruops=3"])
    assert bad.exit_code == 1 and "unknown config key 'rollout.gruops'" in bad.output


EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_config_loads(path):
    cfg = load_run_config(path)
    assert cfg.run_id and cfg.steps >= 1  # validated: load_run_config raises on any bad key


def test_the_examples_cover_the_four_uses():
    assert {"demo", "cluster", "off_policy", "borrowing"} <= {p.stem for p in EXAMPLES}
    borrowing = load_run_config(EXAMPLES[[p.stem for p in EXAMPLES].index("borrowing")])
    assert borrowing.stack.serving_workers == 2 and borrowing.stack.coserving.lease_s == 10.0


def test_every_environment_variable_is_listed_in_one_place():
    import re

    root = Path(__file__).resolve().parents[1]
    used = {name for pkg in ("rose", "flows", "tasks", "executors", "storage", "sim", "dashboards", "envs")
            for path in (root / pkg).rglob("*.py")
            for name in re.findall(r"\bROSE_[A-Z_]*[A-Z]\b", path.read_text())}
    listed = set(re.findall(r"`(ROSE_[A-Z_]+)`", (root / "docs" / "configuration.md").read_text()))
    assert used and used <= listed, f"not in docs/configuration.md: {sorted(used - listed)}"


def test_the_config_offers_exactly_the_registered_environments():
    from typing import get_args

    from envs.registry import ENVS
    from core.config import RolloutConfig

    assert set(get_args(RolloutConfig.model_fields["env"].annotation)) == set(ENVS)
