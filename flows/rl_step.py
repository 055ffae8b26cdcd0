"""One RL step as a Prefect flow: rollout -> reward -> train -> publish.

Each task runs on a Dask worker standing for a GPU (pinned by resource); fine-grained work
(turns, weight pulls) fans out from inside the tasks as plain Dask futures.

Resume: rollout and reward persist their (small) results under a key of run, step and task
source (tasks/caching.py), so a retried or resumed step gets them back as `Cached` and leaves
the step's Arrow file untouched; train asks the trainer's version whether its update already
happened; publish is idempotent. Each run ends with table + markdown artifacts.

With RunConfig.max_staleness = 1 the `train` flow runs two steps at once (flows/pipeline.py):
the rollout uses version step-2, and the gates there order this step's phases after the other.
"""
from __future__ import annotations

import time

import dask
from prefect import flow

from dashboards.artifacts import publish_step_artifacts
from dashboards.events import emit
from flows.coexec import ROLLOUT, TRAIN, active, phase_permit, record_step as record_phase_times
from flows.pipeline import StepGates, active_gates, rollout_version
from core.config import RunConfig, data_dir
from storage.metrics.record import record_step
from storage.trajectories.dataset import PART, TrajectoryStore
from tasks.publish import publish
from tasks.reward import reward
from tasks.rollout import rollout
from tasks.serving import serving_report
from tasks.train import train

ON_TRAINER = {"resources": {"train_gpu": 1}}  # drivers and trainer state live on the trainer


def _phase(name: str, step: int, submit, states: dict[str, str], place: dict = ON_TRAINER,
           spans: dict[str, list[float]] | None = None):
    emit("phase_start", step=step, phase=name)
    t0, began = time.perf_counter(), time.time()
    with dask.annotate(**place):
        future = submit()
    result = future.result()
    seconds = time.perf_counter() - t0
    states[name] = future.state.name  # "Cached" when reused from an earlier attempt
    if spans is not None:
        spans[name] = [began, time.time()]
    emit("phase_end", step=step, phase=name, seconds=seconds, result=result,
         state=states[name])
    return result, seconds


def _gate(gates: StepGates | None, done: str, step: int,
          then_wait: tuple[str, int] | None = None) -> None:
    """Pipelined: say this step finished `done`, then wait for what its next phase needs."""
    if gates is not None:
        gates.mark(done, step)
        if then_wait:
            gates.wait(*then_wait)


def serving_lag_cfg(cfg: RunConfig) -> RunConfig:
    """The rollout's config: serving workers' turns lag the trainer rollout.serving_lag in
    all, and the step's own rollout version already lags it by max_staleness."""
    if not cfg.max_staleness:
        return cfg
    lag = max(0, cfg.rollout.serving_lag - cfg.max_staleness)
    return cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"serving_lag": lag})})


def trajectories_present(cfg: RunConfig, step: int) -> bool:
    return (TrajectoryStore(cfg.trajectories_dir()).step_dir(cfg.run_id, step) / PART).exists()


@flow(name="rl_step", flow_run_name="{cfg.run_id}-step-{step}", log_prints=True)
def rl_step(cfg: RunConfig, step: int) -> dict:
    """Advance the policy from version step-1 to version step."""
    t0 = time.perf_counter()
    states: dict[str, str] = {}
    spans: dict[str, list[float]] = {}  # phase -> [start, end], unix seconds
    gates = active_gates(cfg.run_id)  # None: synchronous (or this step run on its own)
    group = active(cfg.run_id)  # None: not co-executed (flows/coexec.py)
    # pipelined or co-executed, the rollout driver must not hold the trainer's one train_gpu
    place = gates.placement if gates is not None else group.placement_annotations if group else ON_TRAINER
    # A cached rollout whose Arrow file is gone would hand reward a dangling path: recompute.
    roll = rollout.with_options(refresh_cache=not trajectories_present(cfg, step))
    version, roll_cfg = rollout_version(step, cfg.max_staleness), serving_lag_cfg(cfg)
    with phase_permit(cfg.run_id, ROLLOUT):  # co-executed: the group's rollout pool, in turn
        rolled, rollout_s = _phase("rollout", step, lambda: roll.submit(roll_cfg, step, version),
                                   states, place, spans)
        # Reward rewrites the rollout's file: reuse its result only if the rollout was reused too.
        rew = reward.with_options(refresh_cache=states["rollout"] != "Cached")
        rewarded, reward_s = _phase("reward", step, lambda: rew.submit(cfg, step), states, place, spans)
    _gate(gates, "rolled", step, then_wait=("trained", step - 1))
    with phase_permit(cfg.run_id, TRAIN):
        trained, train_s = _phase("train", step, lambda: train.submit(cfg, step), states, place, spans)
        _gate(gates, "trained", step, then_wait=("published", step - 1))
        published, publish_s = _phase("publish", step, lambda: publish.submit(cfg, step), states,
                                      place, spans)
    _gate(gates, "published", step)
    with dask.annotate(**place):  # serving over the whole step, weight pull included
        served = serving_report.submit().result()
    step_s = time.perf_counter() - t0
    tokens = rolled["input_tokens"] + rolled["output_tokens"]
    # A reused rollout took its time in an earlier attempt: count it, or throughput looks inflated.
    busy_s = step_s + (rolled["rollout_s"] if states["rollout"] == "Cached" else 0.0)
    summary = {
        "step": step, "reward": rolled["mean_reward"], "success_rate": rolled["success_rate"],
        "trajectories": rolled["trajectories"], "turns": rolled["turns"], "tokens": tokens,
        "output_tokens": rolled["output_tokens"],
        "prefix_cache_hit_rate": rolled["prefix_cache_hit_rate"],
        "rollout_s": rollout_s, "reward_s": reward_s, "train_s": train_s,
        "publish_s": publish_s, "step_s": step_s, "tokens_per_s": tokens / busy_s,
        "loss": trained.get("loss", 0.0), "grad_norm": trained.get("grad_norm", 0.0),
        "informative": rewarded["informative_trajectories"],
        "publish_bytes": published["bytes"], "policy_version": published["version"],
        "arrow_path": rolled["path"], "rerouted_turns": rolled["rerouted_turns"],
        "interrupted_turns": rolled.get("interrupted_turns", {}),
        "dead_workers": rolled.get("dead_workers", []),
        "publish_left_out": published.get("left_out", {}),  # engines not waited for, and why
        "engine_rollout_s": rolled["rollout_s"], "engine_train_s": trained.get("train_s", 0.0),
        "serving_workers": served.get("serving_workers", 0),
        "slo_attainment": served.get("slo_attainment"),
        "serving_requests": served.get("serving_requests", 0),
        "serving": served.get("serving", {}), "by_kind": rolled.get("by_kind", {}),
        "borrowed_share": rolled.get("by_kind", {}).get("serving", {}).get("share", 0.0),
        # the serving workers this run borrowed, those other runs held, and why not more ("note")
        "borrow": rolled.get("borrow", {}),
        # environment workers: which hosted the step's environments, relaunches after a fault
        "env_hosts": rolled.get("env_hosts", {}),
        # the elastic reward pool: trajectories scored, utilization, queueing, scale-ups
        "reward_service": rolled.get("reward_service") or rewarded.get("reward_service") or {},
        "phase_states": dict(states), "phase_spans": spans, "train_resumed": bool(trained.get("resumed")),
        "rollout_version": version, "stale_tokens": trained.get("stale_tokens", 0.0),
        # co-executed: its group and how long each phase waited for its turn and permit
        "coexec": {"group": group.group, "waited_s": dict(group.waited_s),
                   "refused": group.placement.reason} if group else {},
    }
    if states["rollout"] != "Cached":  # a reused rollout's time was spent in an earlier attempt
        record_phase_times(cfg, step, rollout_s + reward_s, train_s + publish_s)
    publish_step_artifacts(cfg.run_id, summary)
    record_step(data_dir(), cfg.run_dir(), cfg.run_id, summary)  # docs/step_metrics_schema.md
    emit("step_end", **summary)
    return summary
