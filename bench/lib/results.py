"""What every bench ends with: its table printed, its numbers written to bench/results.

`write_json` is the one writer of a bench's JSON: atomic, so an interrupted bench leaves the
previous file whole. `write_result` puts a header before the bench's own fields: what ran,
where and for how long (bench name, machine, cores, seconds, arguments).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from storage.atomic import write_atomic
from storage.cores import available_cores

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"  # committed; docs/results.md is generated from it


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> Console:
    """A right-aligned rich table of `rows` under `columns`, printed; the console it went to."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    return console


def write_json(out: Path, payload: Any, *, indent: int = 1,
               default: Callable[[Any], Any] | None = None) -> None:
    """`payload` into `out` as JSON, atomically; says where it went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(payload, indent=indent, default=default) + "\n")
    Console().print(f"wrote {out}")


def write_result(out: Path, bench: str, args: argparse.Namespace, started: float,
                 **fields: Any) -> None:
    """`fields` into `out` as JSON after the header; says where it went."""
    write_json(out, {
        "bench": bench, "machine": platform.platform(), "cpus": available_cores(),
        "seconds": time.perf_counter() - started,
        "args": {k: str(v) for k, v in vars(args).items()}, **fields})
