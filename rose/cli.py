"""The `rose` command line: `rose up`, `rose down`, `rose status` (+ train/demo/query/models).

Logic lives in modules; this file parses options, and `clear_errors` (rose/cli_errors.py) turns
expected errors into one red line and a non-zero exit (ROSE_DEBUG=1 shows the traceback).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dashboards.web.links import DEFAULT_PORT, page_url
from rose.cli_cluster import cluster_app
from rose.cli_config import config_app
from rose.cli_errors import clear_errors, console, err_console
from core.config import stack_dir
from rose.config_file import load_run_config
from coordination.errors import StackError

app = typer.Typer(help="ROSE: agentic RL post-training on borrowed serving GPUs.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML/JSON run config (keys of RunConfig).")


def _config(config: Optional[Path], **stack):
    return load_run_config(config, {"stack": stack})


@app.command()
@clear_errors
def up(trainers: Optional[int] = typer.Option(None, help="Trainer workers (train_gpu): the ranks of a "
                                              "megatron trainer (train.parallel tp x pp x dp)."),
       rollout_workers: Optional[int] = typer.Option(None, help="Rollout workers (rollout_gpu)."),
       serving_workers: Optional[int] = typer.Option(None, help="Serving workers (serving_gpu)."),
       env_workers: Optional[int] = typer.Option(None, help="Environment workers (env_cpu, CPU only): "
                                                 "each trajectory's environment steps there."),
       reward_workers: Optional[int] = typer.Option(None, help="Cap of the elastic reward pool (reward_cpu, "
                                                    "CPU only): 0 workers while idle, up to this many."),
       prefect_port: Optional[int] = typer.Option(None, help="Prefect server port (default: free)."),
       scheduler_port: Optional[int] = typer.Option(None, help="Dask scheduler port (default: free)."),
       dask_scheduler: Optional[str] = typer.Option(None, help="Use this existing Dask scheduler "
                                                    "(cluster mode, docs/cluster.md)."),
       prefect_api_url: Optional[str] = typer.Option(None, help="Use this existing Prefect "
                                                     "server, e.g. http://host:4200/api."),
       config: Optional[Path] = ConfigOpt) -> None:
    """Start the local stack (Prefect server, Mooncake, Dask scheduler + workers), or reuse it."""
    from rose.launch import dashboard_hint, ensure_models, ensure_serving
    from coordination.stack_record import dead_parts, read_stack
    from rose.stack.local_stack import start_stack
    from rose.stack.status import print_stack

    cfg = _config(config, trainers=trainers, rollout_workers=rollout_workers,
                  serving_workers=serving_workers, env_workers=env_workers, reward_workers=reward_workers,
                  dask_scheduler=dask_scheduler,
                  prefect_api_url=prefect_api_url)
    previous = read_stack(stack_dir())
    dead = dead_parts(previous) if previous else []
    reused = previous is not None and not dead
    if dead:
        err_console.print(f"[yellow]previous stack degraded ({', '.join(dead)}): restarting it[/]")
    if cfg.stack.serving_workers:  # serving workers load the serving and policy models
        ensure_models(cfg, console)
    with console.status("starting the stack (Prefect server takes ~10 s)..."):
        handle = start_stack(cfg.stack, stack_dir(), prefect_port=prefect_port,
                             scheduler_port=scheduler_port)
    ensure_serving(handle, cfg, console)
    console.print("[green]stack already running, reused[/]" if reused else "[green]stack up[/]")
    print_stack(handle, console)
    console.print(dashboard_hint())


@app.command()
@clear_errors
def down() -> None:
    """Stop every process of the stack; checks that none is left."""
    from coordination.coexec_groups import CoexecGroups
    from rose.stack.local_stack import stop_stack
    from coordination.serving_leases import ServingLeases

    stopped = stop_stack(stack_dir())
    ServingLeases(stack_dir()).release()  # no run holds a serving worker of a stopped stack
    CoexecGroups(stack_dir()).release()  # nor is in a co-execution group
    console.print(f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped
                                                          else f" (no stack in {stack_dir()})"))


@app.command()
@clear_errors
def status() -> None:
    """Services and workers of the running stack."""
    from coordination.stack_record import dead_parts, read_stack, recovering_parts
    from rose.stack.status import print_stack

    handle = read_stack(stack_dir())
    if handle is None:
        raise StackError(f"no stack running in {stack_dir()} (start one with `rose up`)")
    print_stack(handle, console)
    recovering = recovering_parts(handle)
    if recovering:  # the supervisor is on it: not an error
        console.print(f"[yellow]recovering:[/] {', '.join(recovering)} (restarted by the "
                      "stack's supervisor)")
    dead = dead_parts(handle)
    if dead:
        raise StackError(f"the stack is degraded, down or not answering: {', '.join(dead)} "
                         "(`rose down` then `rose up`)")


def _run_config(config: Optional[Path], run_id: Optional[str], steps: Optional[int],
                rollout_workers: Optional[int] = None, group: Optional[str] = None):
    from rose.launch import default_run_id

    overrides = {"run_id": run_id, "steps": steps,
                 "stack": {"rollout_workers": rollout_workers}, "coexec": {"group": group}}
    cfg = load_run_config(config, overrides)
    if run_id is None and (config is None or "run_id" not in config.read_text()):
        cfg.run_id = default_run_id("run")
    return cfg


@app.command()
@clear_errors
def train(steps: Optional[int] = typer.Option(None, help="RL steps to reach (default 5)."),
          run_id: Optional[str] = typer.Option(None, help="Run id; an existing run resumes "
                                                "from its last checkpoint."),
          rollout_workers: Optional[int] = typer.Option(None, help="Rollout workers if the "
                                                        "stack must be started."),
          group: Optional[str] = typer.Option(None, help="Co-execution group: runs in it share the "
                                              "rollout and trainer workers, one rolling out while "
                                              "another trains (admitted by host memory and SLO)."),
          config: Optional[Path] = ConfigOpt) -> None:
    """Train: each RL step is an rl_step Prefect flow run on the stack's Dask workers."""
    from rose.launch import run_training

    run_training(_run_config(config, run_id, steps, rollout_workers, group), console)


@app.command()
@clear_errors
def demo(steps: int = typer.Option(5, help="RL steps."),
         serving_workers: int = typer.Option(1, help="Serving workers lent to the run."),
         traffic_sample: float = typer.Option(0.25, help="Fraction of the code trace's requests "
                                              "replayed to the serving endpoints (0: none)."),
         config: Optional[Path] = ConfigOpt) -> None:
    """Build the tiny models, start the stack (a rollout and a serving worker), train a few steps
    while a replay of the code trace drives the serving endpoint; print both sides."""
    from rose.launch import default_run_id, run_training
    from replay.background import BackgroundTraffic

    cfg = load_run_config(config, {"steps": steps, "stack": {"serving_workers": serving_workers}})
    cfg.run_id = default_run_id("demo")
    traffic = BackgroundTraffic(sample=traffic_sample) if traffic_sample > 0 else None
    run_training(cfg, console, traffic=traffic)


@app.command()
@clear_errors
def query(sql: str = typer.Argument(..., help="SQL over the views `turns` (one row per turn), "
                                     "`steps`, `serving` and `kv_timeline` (per RL step) and "
                                     "`transfer` (per publish).")) -> None:
    """DuckDB over the recorded datasets, e.g. rose query "SELECT count(*) FROM turns"."""
    from rose.launch import query as run_query

    run_query(sql, console)


@app.command()
@clear_errors
def dashboard(port: int = typer.Option(DEFAULT_PORT, help="Port on 127.0.0.1.")) -> None:
    """Browser dashboards, live while a run trains: runs, serving SLOs, routing, transfer."""
    from dashboards.web.app import serve
    from core.config import data_dir
    from rose.stack.ports import ensure_free

    console.print(f"dashboards on {page_url(port=ensure_free(port))} (also /serving, /routing, "
                  f"/transfer), data {data_dir()}; Ctrl-C stops")
    serve(data_dir(), port)


@app.command()
@clear_errors
def deploy(config: Optional[Path] = ConfigOpt) -> None:
    """Work pool + prefect.yaml deployments + a process worker (stopped by `rose down`)."""
    from rose.deploy import POOL, deploy as run_deploy

    done = run_deploy(_config(config), console)
    console.print(f"[green]deployed[/] {', '.join(done.deployments)} on pool {POOL}; worker pid "
                  f"{done.worker_pid}{' (reused)' if done.worker_reused else ''}")
    console.print(f"run one from the UI ({done.ui_url}/deployments) or: "
                  "prefect deployment run train/train")


@app.command()
@clear_errors
def resume(run_id: str = typer.Argument(..., help="The run to continue."),
           steps: Optional[int] = typer.Option(None, help="Steps to reach (default: the run's).")
           ) -> None:
    """Continue a failed or stopped run: finished phases are reused, not recomputed."""
    from rose.resume import resume as run_resume

    run_resume(run_id, steps, console)


models_app = typer.Typer(help="Locally built models (no hub downloads).", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("build")
@clear_errors
def models_build(force: bool = typer.Option(False, help="Rebuild even if up to date."),
                 config: Optional[Path] = ConfigOpt) -> None:
    """Tokenizer + Qwen3 policy (warmed up on demonstrations) + Qwen2 serving model."""
    from rose.models.build import build_models

    cfg = load_run_config(config, {})
    with console.status("building models"):
        policy, serving = build_models(cfg.models, force=force)
    console.print(f"policy: {policy}\nserving: {serving}")


app.add_typer(cluster_app, name="cluster")
app.add_typer(config_app, name="config")

serve_app = typer.Typer(help="Serving side: trace replay against serving endpoints.",
                        no_args_is_help=True)
app.add_typer(serve_app, name="serve")


def _stack_endpoints() -> list[str]:
    from coordination.stack_record import read_stack

    handle = read_stack(stack_dir())
    if handle is None:
        raise StackError(f"no stack running in {stack_dir()} (start one with `rose up "
                         "--serving-workers 1`)")
    return [handle.endpoints[n] for n in sorted(handle.endpoints)]


@serve_app.command("endpoints")
@clear_errors
def serve_endpoints() -> None:
    """The running stack's serving endpoints (OpenAI-compatible), one URL per line."""
    urls = _stack_endpoints()
    if not urls:
        raise StackError("the stack has no serving endpoint (start it with --serving-workers N)")
    for url in urls:
        print(url)


@serve_app.command("replay")
@clear_errors
def serve_replay(
        endpoint: Optional[list[str]] = typer.Option(None, help="Endpoint base URL (repeat for "
                                                     "several; default: the stack's endpoints)."),
        trace: Path = typer.Option(None, help="Trace CSV (default: the Azure 2023 code trace)."),
        start: Optional[float] = typer.Option(None, help="Window start, trace seconds."),
        duration: float = typer.Option(600.0, help="Window length, trace seconds."),
        around_peak: bool = typer.Option(False, help="Center the window on the busiest second."),
        time_scale: float = typer.Option(1.0, help="Replay seconds per trace second (0.1 = 10x faster)."),
        length_scale: float = typer.Option(1.0, help="Prompt tokens per trace context token."),
        output_scale: Optional[float] = typer.Option(None, help="Output tokens per trace "
                                                     "generated token (default: length scale)."),
        sample: float = typer.Option(1.0, help="Fraction of the window's requests sent (seeded)."),
        seed: int = typer.Option(0, help="Seed for sampling and synthetic prompts."),
        slo_ttft: Optional[float] = typer.Option(None, help="TTFT SLO (s) for attainment."),
        slo_tpot: Optional[float] = typer.Option(None, help="TPOT SLO (s) for attainment."),
        vocab_size: Optional[int] = typer.Option(None, help="Token id range (default: endpoint's)."),
        max_model_len: Optional[int] = typer.Option(None, help="Context to clamp to (default: endpoint's)."),
        out: Path = typer.Option(Path("replay-results"), help="Output directory.")) -> None:
    """Replay a window of a serving trace (EOS ignored, synthetic prompts); TTFT/TPOT per request."""
    from replay.job import ReplayJob, run_replay
    from core.trace import DEFAULT_TRACE

    job = ReplayJob(endpoints=endpoint or _stack_endpoints(), trace=trace or DEFAULT_TRACE,
                    start_s=start, duration_s=duration, around_peak=around_peak,
                    time_scale=time_scale, length_scale=length_scale, output_scale=output_scale,
                    sample=sample, seed=seed, slo_ttft_s=slo_ttft, slo_tpot_s=slo_tpot,
                    vocab_size=vocab_size, max_model_len=max_model_len, out_dir=out)
    run_replay(job, console)


if __name__ == "__main__":
    app()
