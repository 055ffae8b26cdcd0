"""`rose train` / `rose demo`: make sure models and the stack exist, then run the train flow.

The flow runs in this (driver) process against the stack's Prefect server, so every rl_step
shows up in the Prefect UI while a rich live view shows the phases here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console

from core.config import RunConfig, data_dir, stack_dir
from rose.config_file import ConfigError
from storage.atomic import write_atomic


def ensure_models(cfg: RunConfig, console: Console) -> None:
    from rose.models.build import build_models

    policy = cfg.models.policy_path()
    if cfg.models.policy_dir and not (policy / "config.json").is_file():
        raise FileNotFoundError(f"model directory {policy} does not exist or has no config.json")
    if not (policy / "config.json").is_file() or not (cfg.models.serving_path() / "config.json").is_file():
        with console.status("building the tiny models (tokenizer, Qwen3 policy warm-up, "
                            "Qwen2 serving model): a few minutes, once"):
            build_models(cfg.models)


def ensure_stack(cfg: RunConfig, console: Console):
    """Reuse the running local stack (or the configured cluster addresses), else start one."""
    from coordination.stack_record import load_stack
    from rose.stack.local_stack import apply_env, stack_env, start_stack

    handle = load_stack(stack_dir())
    if handle is None:
        with console.status("starting the local stack: Prefect server, Mooncake master, "
                            "Dask scheduler and workers (~30 s)"):
            handle = start_stack(cfg.stack, stack_dir())
    apply_env(stack_env(handle))
    ensure_serving(handle, cfg, console)
    return handle


def ensure_serving(handle, cfg: RunConfig, console: Console) -> dict[str, str]:
    """Serving workers co-serve from the start: their engines and endpoints come up with the
    stack (a no-op when they already run); the endpoint URLs go into the stack file."""
    from rose.stack.local_stack import update_stack
    from executors.coserving.registration import serving_workers, start_serving

    with handle.scheduler().client() as client:
        if not serving_workers(client):
            return {}
        with console.status("serving workers: building the serving + rollout engines, "
                            "profiling them, opening the OpenAI endpoints"):
            # a worker restarting now keeps its URL (its port is the stack's for life)
            endpoints = {**handle.endpoints, **start_serving(client, cfg.models, cfg.stack)}
    if endpoints != handle.endpoints:
        handle.endpoints = endpoints  # into the file as one step: the supervisor writes it too
        update_stack(handle.run_dir, lambda h: setattr(h, "endpoints", endpoints))
    return endpoints


BASELINE_S = 60.0  # wall seconds of serving-alone replay before a run with background traffic


def check_trainer_layout(cfg: RunConfig) -> None:
    """A megatron layout the policy cannot take (TP not dividing the heads, PP not dividing the
    layers) or a stack to be started with fewer trainers than ranks: a ConfigError, before
    anything starts. (A running stack's trainers are counted when the run attaches.)"""
    if cfg.train.backend != "megatron":
        return
    from transformers import AutoConfig

    from executors.training.megatron_model import check_layout

    par = cfg.train.parallel
    try:
        check_layout(par, AutoConfig.from_pretrained(cfg.models.policy_path()))
    except ValueError as e:
        raise ConfigError(f"train.parallel: {e}") from None
    from coordination.stack_record import read_stack

    if read_stack(stack_dir()) is None and not cfg.stack.dask_scheduler and cfg.stack.trainers < par.world:
        raise ConfigError(f"train.parallel tp={par.tp} pp={par.pp} dp={par.dp} needs {par.world} trainer "
                          f"workers, stack.trainers is {cfg.stack.trainers} (or `rose up --trainers {par.world}`)")


def run_training(cfg: RunConfig, console: Console | None = None, live: bool = True,
                 traffic=None) -> list[dict]:
    """Models, stack, then the run. With `traffic` (replay.background.BackgroundTraffic) and
    serving workers, a background replay drives their endpoints while the run trains."""
    from coordination.run_lease import driving

    console = console or Console()
    with driving(cfg.run_dir(), cfg.run_id):  # refused now, not after the stack and models
        return _run_training(cfg, console, live, traffic)


def _run_training(cfg: RunConfig, console: Console, live: bool, traffic) -> list[dict]:
    ensure_models(cfg, console)
    check_trainer_layout(cfg)
    handle = ensure_stack(cfg, console)
    console.print(dashboard_hint())  # live while the run trains
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # the live view is the log here
    from contextlib import nullcontext
    from dataclasses import replace

    from dashboards.progress import admission_table, live_progress, serving_users_table, step_table
    from flows.train import train
    from replay.background import BackgroundReplay

    users = alone = slo_note = None
    if traffic is not None and handle.endpoints:
        endpoints = list(handle.endpoints.values())
        # the run's users replay the reference window back to back: the traffic the SLO was
        # derived from, never a later burst serving alone was not measured on
        reference = BASELINE_S / traffic.time_scale
        traffic = replace(traffic, period_s=reference)
        with console.status(f"serving alone first: the first {BASELINE_S:.0f} s of the same "
                            "traffic, nothing training (the reference for the run)"):
            alone = BackgroundReplay(endpoints, replace(traffic, window_s=reference)).play()
        slo_note = derive_run_slo(handle, alone, console)
        users = BackgroundReplay(endpoints, traffic)
    with users or nullcontext():
        if live:
            with live_progress(console):
                summaries = train(cfg)
            if not console.is_terminal:  # a redirected Live ends its last frame without a newline
                console.print()
        else:
            summaries = train(cfg)
            console.print(step_table(summaries))
    served = None
    if users is not None:
        table, served = serving_users_table(users, summaries, alone, BASELINE_S, slo_note)
        console.print(table)
        console.print(admission_table(summaries))
        keep_user_requests(cfg, traffic, {"serving_alone": alone, "serving_users": users})
    write_atomic(cfg.run_dir() / "summary.json", json.dumps(
        {"run": cfg.run_id, "steps": summaries, "serving_users": served}, indent=1, default=str))
    data = cfg.trajectories_dir() / f"run={cfg.run_id}"
    console.print(f"[bold]trajectories[/] (Arrow/Parquet): {data}")
    console.print(f"[bold]summary[/] (steps, serving users): {cfg.run_dir() / 'summary.json'}")
    if users is not None:
        console.print(f"[bold]serving users' requests[/]: {cfg.run_dir() / 'serving_users' / 'requests.parquet'}")
    console.print(f"[bold]query them[/]: rose query \"SELECT step, avg(trajectory_reward) "
                  f"FROM turns WHERE run='{cfg.run_id}' GROUP BY step ORDER BY step\"")
    console.print(f"[bold]Prefect UI[/]: {handle.prefect_ui_url}  (flow runs: rl_step, train)")
    console.print("stop the stack with [bold]rose down[/]")
    return summaries


def keep_user_requests(cfg: RunConfig, traffic, replays: dict) -> None:
    """Each replay's requests (send time, lateness, TTFT, TPOT, errors) as
    `<run dir>/<name>/requests.parquet` beside its summary and the trace's notice: when the
    users missed their SLO, which requests did, and when."""
    from core.trace import trace_notice
    from replay.replayer import write_results

    notice = trace_notice(traffic.trace, required=False)
    for name, replay in replays.items():
        write_results(cfg.run_dir() / name, replay.records, replay.summary, notice,
                      {"run": cfg.run_id, "replay": name, "period_s": traffic.period_s,
                       "time_scale": traffic.time_scale, "sample": traffic.sample})


def derive_run_slo(handle, alone, console: Console):
    """The serving workers hold the run to an SLO serving alone met on this machine just now
    (slo_from_serving_alone over the reference replay's requests; the profile's SLO is the
    floor); the derivation is printed and goes into /metrics as the SLO's source."""
    from executors.policies.slo_admission import slo_from_serving_alone
    from executors.coserving.registration import current_slo, hold_serving_slo

    ok = [r for r in alone.records if r.ok]
    with handle.scheduler().client() as client:
        floor = current_slo(client)
        if floor is None or not ok:
            return None
        slo, how = slo_from_serving_alone([r.ttft_s for r in ok], [r.tpot_s for r in ok], floor)
        hold_serving_slo(client, slo, f"serving alone over the run's first {BASELINE_S:.0f} s: {how}")
    console.print(f"[bold]serving SLO[/] for this run: {how}")
    return how


def dashboard_hint() -> str:
    from dashboards.web.links import page_url

    return (f"[bold]dashboards[/]: [bold]rose dashboard[/] serves {page_url()} "
            "(also /serving, /routing, /transfer), live while a run trains")


def default_run_id(prefix: str = "run") -> str:
    """A fresh id per invocation, so a rerun never resumes someone else's state by accident."""
    import time

    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def query(sql: str, console: Console | None = None, root: Path | None = None) -> None:
    from rich.table import Table

    from storage.catalog import query as catalog_query

    console = console or Console()
    result = catalog_query(root or data_dir(), sql)  # views turns, steps, serving
    table = Table(header_style="bold cyan")
    for name in result.column_names:
        table.add_column(name)
    for row in result.to_pylist():
        table.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()])
    console.print(table)
