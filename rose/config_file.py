"""Read a run configuration from a YAML/JSON file plus command-line overrides, and say where
each effective value came from (`rose config show`).

Every problem becomes one ConfigError line naming the key or the file, e.g.
"unknown config key 'stack.foo' in run.yaml".
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from core.config import MOVED_KEYS, RunConfig, data_dir, move_keys


class ConfigError(ValueError):
    """The run configuration is invalid; the message names the key or file."""


def read_config_file(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text()
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # yaml and json errors alike: report the first line only
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot parse {path}: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys, not {type(data).__name__}")
    return data


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Nested merge; None in overrides means 'not given on the command line'."""
    out = dict(base)
    for k, v in overrides.items():
        if v is None:
            continue
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        elif isinstance(v, dict):
            out[k] = merge({}, v)
        else:
            out[k] = v
    return out


def describe(err: ValidationError, source: str) -> str:
    """The first validation problem as one line."""
    e = err.errors()[0]
    key = ".".join(str(p) for p in e["loc"]) or "<root>"
    where = f" in {source}" if source else ""
    if e["type"] == "extra_forbidden":
        return f"unknown config key '{key}'{where}"
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    msg = e["msg"].removeprefix("Value error, ")
    if not e["loc"]:  # a check across fields: its message names them
        return f"{msg}{where}{more}"
    return f"bad config value for '{key}'{where}: {msg}{more}"


def load_run_config(path: Path | None = None,
                    overrides: dict[str, Any] | None = None) -> RunConfig:
    data = read_config_file(path) if path else {}
    data = merge(data, overrides or {})
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe(e, str(path) if path else "")) from None


class Setting(NamedTuple):
    key: str  # dotted, e.g. "rollout.heartbeat_s"
    value: Any
    source: str  # "default", "file", "flag" or "env", with the old key or the variable in brackets


def _leaves(model: BaseModel, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every field, nested models walked into."""
    out: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name}"
        out.update(_leaves(value, key + ".") if isinstance(value, BaseModel) else {key: value})
    return out


def _given(data: dict[str, Any], prefix: str = "", none_given: bool = True) -> set[str]:
    """Dotted keys a file or the command line gave (an override of None is no override)."""
    out: set[str] = set()
    for k, v in data.items():
        if v is None and not none_given:
            continue
        out |= _given(v, f"{prefix}{k}.", none_given) if isinstance(v, dict) and v else {prefix + k}
    return out


def config_sources(path: Path | None = None,
                   overrides: dict[str, Any] | None = None) -> list[Setting]:
    """The effective run config, one Setting per key, and where each value came from: a flag
    (command-line override) over the file over the default. The data directory, which models
    and runs live under, comes from the environment (ROSE_DATA_DIR) or its default."""
    cfg = load_run_config(path, overrides)
    raw = read_config_file(path) if path else {}
    moved = {".".join(new): ".".join(old) for old, new in MOVED_KEYS.items()
             if isinstance(raw.get(old[0]), dict) and old[1] in raw[old[0]]}
    from_file, from_flags = _given(move_keys(raw)), _given(overrides or {}, none_given=False)

    def source(key: str) -> str:
        def hit(given: set[str]) -> bool:
            return key in given or any(g.startswith(key + ".") for g in given)
        if hit(from_flags):
            return "flag"
        if hit(from_file):
            return f"file ({moved[key]})" if key in moved else "file"
        return "default"

    env = "ROSE_DATA_DIR"
    out = [Setting("data_dir", data_dir(), f"env ({env})" if os.environ.get(env) else "default")]
    # unset model directories are under the data directory: shown as the paths they resolve to
    derived = {"models.policy_dir": cfg.models.policy_path(),
               "models.serving_dir": cfg.models.serving_path()}
    return out + [Setting(k, derived[k] if v is None and k in derived else v, source(k))
                  for k, v in _leaves(cfg).items()]
