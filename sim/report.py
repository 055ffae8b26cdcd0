"""What a simulation reports: step throughput, serving P99s and SLO attainment, borrowed share,
affinity hit rate, and the conservation counters (no trajectory lost)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executors.policies.slo_admission import SLOConfig
    from sim.cluster import ClusterSim


def p99(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]


def summarize(sim: "ClusterSim", wall_s: float) -> dict:
    c, cfg, steps = sim.counts, sim.cfg, sim.steps
    # run time to the last publish: with one-step off-policy, steps overlap (a sum would double count)
    step_s = max((s["end_s"] for s in steps), default=0.0)
    tokens = sum(s["tokens"] for s in steps)
    served = [x for d in sim.serving_devices for x in d.stats.done]
    horizon = max(sim.loop.now, 1e-9)
    busy = [d.stats.busy_s / horizon for d in sim.serving_devices]
    in_flight = len(sim.trajs)
    done = len(steps) == cfg.steps
    rollout_mean = sum(s["rollout_s"] for s in steps) / max(1, len(steps))
    p75 = [s["trajectory_s"]["p75"] / s["rollout_s"] for s in steps if s.get("trajectory_s") and s["rollout_s"] > 0]
    return {
        "config": cfg.config, "mode": cfg.mode, "gpus": cfg.gpus, "train_gpus": cfg.train_gpus,
        "rollout_gpus": cfg.rollout_gpus, "serving_gpus": cfg.serving_gpus, "steps": len(steps),
        "seed": cfg.seed, "serving_rate": cfg.serving_rate,
        "trajectories_per_step": cfg.traj_per_rollout_gpu * cfg.rollout_gpus,
        # a run that did not finish its steps within the horizon has no throughput, not 0 tok/s
        "finished": done, "unfinished_steps": cfg.steps - len(steps),
        "tokens_per_s": tokens / step_s if step_s and done else None,
        "step_s_mean": step_s / max(1, len(steps)), "off_policy": cfg.off_policy,
        "rollout_s_mean": rollout_mean,
        "rollout_share": rollout_mean * len(steps) / step_s if step_s else None,
        "trajectory_p75_share": sum(p75) / len(p75) if p75 else None,
        "preempted": sum(d.preempted for d in sim.devices.values()),
        "borrowed_share": c["borrowed_tokens"] / c["tokens"] if c["tokens"] else 0.0,
        "affinity_hit_rate": c["affine"] / c["later_turns"] if c["later_turns"] else 0.0,
        "prefix_hit_tokens": c["cached"] / c["prompt"] if c["prompt"] else 0.0,
        # a turn's pace where it ran: seconds from placement to its end per response token
        "turn_s_per_token": {kind: c[f"turn_s_{kind}"] / c[f"out_{kind}"] if c[f"out_{kind}"] else None
                             for kind in ("dedicated", "borrowed")},
        "serving_requests": len(served),
        "ttft_p99_s": p99([t for t, _ in served]), "tpot_p99_s": p99([t for _, t in served]),
        "slo_ttft_s": sim.slo.ttft_s, "slo_tpot_s": sim.slo.tpot_s,
        "slo_attainment": attainment(sim, sim.slo),
        "serving_busy_mean": sum(busy) / len(busy) if busy else 0.0,
        "trajectories_started": c["started"], "trajectories_finished": c["finished"],
        "trajectories_in_flight": in_flight, "turns": c["turns"], "turns_rerouted": c["rerouted"],
        "turns_handed_back": c["handed_back"], "algorithm": cfg.algorithm,
        "trajectories_dropped": c["dropped"], "long_rounds": c.get("long_rounds", 0),
        # elastic: the external GPUs' allocation per step, as a share of the step (paper Fig. 8b)
        "allocation_share": cfg.elastic_alloc_s * len(steps) / step_s if cfg.config == "elastic" and step_s else 0.0,
        "stall_kept": sum(d.stall_kept for d in sim.devices.values()),
        "kv_cuts": sum(d.memory.cuts for d in sim.devices.values() if d.memory is not None),
        "events": sim.loop.events, "sim_s": sim.loop.now, "wall_s": wall_s,
        "per_step": steps,
    }


def attainment(sim: "ClusterSim", slo: "SLOConfig") -> float | None:
    """The share of finished serving requests within both sides of `slo` (None: none finished)."""
    served = [x for d in sim.serving_devices for x in d.stats.done]
    ok = sum(1 for ttft, tpot in served if ttft <= slo.ttft_s and tpot <= slo.tpot_s)
    return ok / len(served) if served else None


def judged_at(sim: "ClusterSim", result: dict, slo: "SLOConfig") -> dict:
    """`result` of a fixed run judged at another SLO. Its serving GPUs only serve (no admission
    reads the SLO), so that is what a run at `slo` gives: one run both sets an SLO and meets it."""
    if sim.cfg.config != "fixed":
        raise ValueError(f"only a fixed run ignores its SLO; {sim.cfg.config!r} admits rollout steps by it")
    return result | {"slo_ttft_s": slo.ttft_s, "slo_tpot_s": slo.tpot_s, "slo_attainment": attainment(sim, slo)}


def speedup(run: dict, base: dict) -> float | None:
    """run's throughput over base's; None where either did not finish its steps."""
    a, b = run.get("tokens_per_s"), base.get("tokens_per_s")
    return a / b if a is not None and b else None


def rate_text(r: dict) -> str:
    """A run's throughput for a table: unfinished runs say so."""
    if r.get("tokens_per_s") is None:
        left = r.get("unfinished_steps", 0)
        return f"unfinished ({left} of {r.get('steps', 0) + left} steps)"
    return f"{r['tokens_per_s']:,.0f}"
