"""`rose config ...`: the effective run configuration and where each value came from."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from rose.cli_errors import clear_errors, console
from rose.config_file import ConfigError, config_sources, merge

config_app = typer.Typer(help="The run configuration (keys of RunConfig, docs/configuration.md).",
                         no_args_is_help=True)


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """`key.path=value` pairs (values read as YAML: 4, 0.5, true, [a, b]) as nested overrides."""
    import yaml

    out: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set takes KEY=VALUE, e.g. rollout.groups=4 (got {item!r})")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        nested: dict[str, Any] = {key.strip().split(".")[-1]: value}
        for part in reversed(key.strip().split(".")[:-1]):
            nested = {part: nested}
        out = merge(out, nested)
    return out


@config_app.command("show")
@clear_errors
def show(config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON run config."),
         sets: Optional[list[str]] = typer.Option(None, "--set", help="Override a key as a flag "
                                                  "would, e.g. --set rollout.groups=4 (repeat)."),
         changed: bool = typer.Option(False, help="Only the keys that are not at their default.")
         ) -> None:
    """Print the effective run config: every key, its value, and where it came from
    (default, file, flag or env): `key  source  value`, one line each."""
    rows = [s for s in config_sources(config, parse_sets(sets or []))
            if not (changed and s.source == "default")]
    key_w, src_w = (max((len(r[i]) for r in rows), default=0) for i in (0, 2))
    # value last: long paths never wrap the columns; defaults dimmed
    for s in rows:
        line = escape(f"{s.key:<{key_w}}  {s.source:<{src_w}}  {s.value}")
        console.print(f"[dim]{line}[/]" if s.source == "default" else line, highlight=False,
                      soft_wrap=True)
