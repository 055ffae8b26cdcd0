"""Read a run configuration from a YAML/JSON file plus command-line overrides.

Every problem becomes one ConfigError line naming the key or the file, e.g.
"unknown config key 'stack.foo' in run.yaml".
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rose.config import RunConfig


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
