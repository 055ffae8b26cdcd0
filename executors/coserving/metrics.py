"""The co-serving executor's metrics snapshot: counters, policy state, SLO, profiles.

Built on the loop thread (it reads engine and policy state) and handed out as a plain dict;
the endpoint's /metrics flattens its numbers into gauges.
"""
from __future__ import annotations

import time


def snapshot(ex) -> dict:
    c, s, r = ex.counters, ex.serving, ex.rollout_counters
    decisions = max(1, c["decisions"])
    return {
        "at": time.monotonic(), "worker": ex.worker, "mode": ex.cfg.mode, "version": ex.version,
        "admitting": ex._admitting,
        "slo": {"ttft_s": ex.slo.ttft_s, "tpot_s": ex.slo.tpot_s, "source": ex.slo_source,
                "rollout_slowdown": ex.rollout_slowdown, "serving_slowdown": ex.serving_slowdown,
                "p99_overrun": ex.margin.factor(ex.serving_margin),
                "arrival_prompt_len": ex.admission.arrival_prompt_len,
                "turn_start_open_share": ex.turn_gate.open_share(time.monotonic()),
                "p99_ratio": {"rollout": ex.margin.tail(), "serving": ex.serving_margin.tail()}},
        "serving": {"submitted": c["serving_submitted"], "finished": s.finished,
                    "in_flight": len(s.live),
                    "queued_prefills": sum(not x.times for x in s.live.values()),
                    "tokens": s.tokens, "steps": s.steps,
                    "mean_step_ms": 1e3 * s.step_s / max(1, s.steps),
                    "used_blocks": s.used_blocks(), "block_cap": s.scheduler.block_cap,
                    "callback_errors": s.callback_errors},
        "rollout": {"up": ex.rollout is not None, "submitted": c["rollout_submitted"],
                    "in_flight": len(ex.rollout.live) if ex.rollout is not None else 0,
                    **{k: v for k, v in r.items() if not k.endswith("_s")},
                    "mean_step_ms": 1e3 * r["step_s"] / max(1, r["steps"]),
                    "mean_predicted_ms": 1e3 * r["predicted_s"] / max(1, r["planned_steps"]),
                    "mean_abs_error_ms": 1e3 * r["abs_error_s"] / max(1, r["planned_steps"]),
                    "used_blocks": ex.rollout.used_blocks() if ex.rollout is not None else 0,
                    "page_ratio": ex.page_ratio, "admitted": c["admitted"],
                    "denied": dict(c["denied"]), "step_sizes": dict(c["step_sizes"]),
                    "yielded_to_users": c["yielded_to_users"], "evictions": ex.autoscale.evictions,
                    "reload_s": list(ex.autoscale.reload_s)},
        "park": dict(ex.parking),
        "kv": {"total_pages": ex.total, **(ex.policy.snapshot() if ex.policy is not None else {})},
        "loop": {"iterations": c["iterations"],
                 "mean_overhead_us": 1e6 * c["loop_s"] / max(1, c["iterations"]),
                 "mean_decide_us": 1e6 * c["decide_s"] / decisions, "errors": ex.loop_errors,
                 "startup_s": ex.startup_s},
        "profiles": ex.profiles,
    }
