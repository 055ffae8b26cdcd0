"""How the `rose` command line reports: its consoles, and `clear_errors`, which turns an
expected failure into one red line and exit code 1 (ROSE_DEBUG=1 shows the traceback)."""
from __future__ import annotations

import functools
import os
from typing import Callable, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console

from rose.config_file import ConfigError, describe
from coordination.errors import StackError

F = TypeVar("F", bound=Callable)
# Wide enough for the step table when piped (CI logs, `make demo | tee`).
console = Console(width=None if Console().is_terminal else 140)
err_console = Console(stderr=True)


def clear_errors(fn: F) -> F:
    """Expected failures print one red line and exit 1: never a traceback, never a hang."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            err_console.print("[red]interrupted[/]")
            raise typer.Exit(130) from None
        except Exception as e:
            if os.environ.get("ROSE_DEBUG"):
                raise
            known = (StackError, ConfigError, FileNotFoundError, NotADirectoryError,
                     ValidationError)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if isinstance(e, ValidationError):  # options checked by a pydantic model
                msg = describe(e, "")
            if not isinstance(e, known):
                msg = f"{type(e).__name__}: {msg} (ROSE_DEBUG=1 shows the traceback)"
            err_console.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
    return wrapper  # type: ignore[return-value]
