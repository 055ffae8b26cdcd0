"""What every bench here ends with: its table printed, its numbers written to bench/results.

A result file starts with what ran, where and for how long (bench name, machine, cores,
seconds, arguments), then the bench's own fields; it is written atomically, so an interrupted
bench leaves the previous file whole.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from storage.atomic import write_atomic
from storage.cores import available_cores


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


def write_result(out: Path, bench: str, args: argparse.Namespace, started: float,
                 **fields: Any) -> None:
    """`fields` into `out` as JSON after the header; says where it went."""
    write_atomic(out, json.dumps({
        "bench": bench, "machine": platform.platform(), "cpus": available_cores(),
        "seconds": time.perf_counter() - started,
        "args": {k: str(v) for k, v in vars(args).items()}, **fields}, indent=1))
    Console().print(f"wrote {out}")
