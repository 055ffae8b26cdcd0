"""The `rose` command line: `rose up`, `rose down`, `rose status` (+ train/demo/query/models).

Logic lives in modules; this file parses options and turns expected errors into one red line
and a non-zero exit (ROSE_DEBUG=1 shows the traceback).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from rose.config_file import ConfigError, load_run_config
from rose.stack.errors import StackError

app = typer.Typer(help="ROSE: agentic RL post-training on borrowed serving GPUs.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console()
err_console = Console(stderr=True)

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML/JSON run config (keys of RunConfig).")
RunIdOpt = typer.Option(None, "--run-id", help="Run id (default: the config's, 'demo').")


def clear_errors(fn):
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
            known = (StackError, ConfigError, FileNotFoundError, NotADirectoryError)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if not isinstance(e, known):
                msg = f"{type(e).__name__}: {msg} (ROSE_DEBUG=1 shows the traceback)"
            err_console.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
    return wrapper


def _config(config: Optional[Path], run_id: Optional[str], **stack):
    return load_run_config(config, {"run_id": run_id, "stack": stack})


@app.command()
@clear_errors
def up(rollout_workers: Optional[int] = typer.Option(None, help="Rollout workers (rollout_gpu)."),
       serving_workers: Optional[int] = typer.Option(None, help="Serving workers (serving_gpu)."),
       prefect_port: Optional[int] = typer.Option(None, help="Prefect server port (default: free)."),
       scheduler_port: Optional[int] = typer.Option(None, help="Dask scheduler port (default: free)."),
       run_id: Optional[str] = RunIdOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Start the local stack (Prefect server, Mooncake, Dask scheduler + workers), or reuse it."""
    from rose.stack.local_stack import load_stack, start_stack
    from rose.stack.status import print_stack

    cfg = _config(config, run_id, rollout_workers=rollout_workers, serving_workers=serving_workers)
    reused = load_stack(cfg.run_dir()) is not None
    with console.status("starting the stack (Prefect server takes ~10 s)..."):
        handle = start_stack(cfg.stack, cfg.run_dir(), prefect_port=prefect_port,
                             scheduler_port=scheduler_port)
    console.print("[green]stack already running, reused[/]" if reused else "[green]stack up[/]")
    print_stack(handle, console)


@app.command()
@clear_errors
def down(run_id: Optional[str] = RunIdOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Stop every process of the stack; checks that none is left."""
    from rose.stack.local_stack import stop_stack

    cfg = _config(config, run_id)
    stopped = stop_stack(cfg.run_dir())
    console.print(f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped
                                                          else f" (no stack for run {cfg.run_id})"))


@app.command()
@clear_errors
def status(run_id: Optional[str] = RunIdOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Services and workers of the running stack."""
    from rose.stack.local_stack import dead_parts, read_stack
    from rose.stack.status import print_stack

    cfg = _config(config, run_id)
    handle = read_stack(cfg.run_dir())
    if handle is None:
        raise StackError(f"no stack running for run '{cfg.run_id}' (start one with `rose up`)")
    print_stack(handle, console)
    dead = dead_parts(handle)
    if dead:
        raise StackError(f"stack of run '{cfg.run_id}' is degraded: {', '.join(dead)} "
                         "not answering (`rose down` then `rose up`)")


# ---- TODO(lead): `rose train`   -> flows.train (see flows/train.py), with @clear_errors ----
# ---- TODO(lead): `rose demo`    -> models build if missing, up, train --steps 5, summary  ----
# ---- TODO(lead): `rose query`   -> DuckDB over the trajectories dataset                    ----
# ---- TODO(lead): `rose models build` (a typer sub-app: app.add_typer(models_app, name="models"))

if __name__ == "__main__":
    app()
