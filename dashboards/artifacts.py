"""Prefect artifacts per RL step: a table of the step's numbers and a short markdown summary.

Keys are `<run>-step-<n>` (table) and `<run>-step-<n>-summary` (markdown), so the Artifacts page
of the UI keeps one history per step: a retried or resumed step adds a new version under the
same key. Prefect allows only lowercase letters, digits and dashes in keys.
"""
from __future__ import annotations

import re

from dashboards.web.links import page_url

NA = "n/a"


def artifact_key(run_id: str, step: int) -> str:
    key = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-") or "run"
    return f"{key}-step-{step}"


def _fmt(value, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return NA
    if isinstance(value, float):
        return f"{value:.{digits}g}{unit}"
    return f"{value:,}{unit}" if isinstance(value, int) else f"{value}{unit}"


def slo_attainment(summary: dict) -> str:
    """Share of serving requests within both SLOs during the step, or n/a without serving work."""
    value = summary.get("slo_attainment")
    if value is None or not summary.get("serving_workers"):
        return NA
    return f"{value:.1%}"


def step_rows(summary: dict) -> list[dict]:
    """metric / value rows for the table artifact (strings, so the UI shows them as written)."""
    s = summary
    rows = [
        ("throughput", _fmt(s.get("tokens_per_s"), " tokens/s", 4)),
        ("tokens (input + output)", _fmt(s.get("tokens"))),
        ("mean trajectory reward", _fmt(s.get("reward"))),
        ("success rate", NA if s.get("success_rate") is None else f"{s['success_rate']:.0%}"),
        ("trajectories / turns", f"{s.get('trajectories', NA)} / {s.get('turns', NA)}"),
        ("prefix cache hit rate", NA if s.get("prefix_cache_hit_rate") is None
         else f"{s['prefix_cache_hit_rate']:.0%}"),
        ("rollout s", _fmt(s.get("rollout_s"))),
        ("reward s", _fmt(s.get("reward_s"))),
        ("train s", _fmt(s.get("train_s"))),
        ("publish s", _fmt(s.get("publish_s"))),
        ("step s", _fmt(s.get("step_s"))),
        ("SLO attainment (serving)", slo_attainment(s)),
        ("transfer bytes (publish)", _fmt(s.get("publish_bytes"))),
        ("rerouted turns", _fmt(s.get("rerouted_turns"))),
        ("policy version", _fmt(s.get("policy_version"))),
    ]
    for kind, k in sorted((s.get("by_kind") or {}).items()):
        rows.append((f"{kind} workers: turns / tokens / share",
                     f"{k['turns']:,} / {k['tokens']:,} / {k['share']:.0%}"))
    for name, w in sorted((s.get("serving") or {}).items()):
        p99 = "/".join(_fmt(None if w.get(q) is None else 1e3 * w[q], " ms")
                       for q in ("ttft_p99_s", "tpot_p99_s"))
        att = NA if w.get("slo_attainment") is None else f"{w['slo_attainment']:.1%}"
        rows.append((f"{name}: requests, TTFT/TPOT p99, SLO met, rollout admitted/aborted",
                     f"{w['requests']:,}, {p99}, {att}, "
                     f"{w['rollout_admitted']:,}/{w['rollout_aborted']:,}"))
    return [{"metric": m, "value": v} for m, v in rows]


def step_markdown(run_id: str, summary: dict) -> str:
    s = summary
    phases = s.get("phase_states") or {}
    reused = [p for p, state in phases.items() if state == "Cached"]
    lines = [
        f"### {run_id}: step {s['step']} -> policy v{s.get('policy_version', '?')}",
        "",
        f"- **throughput** {_fmt(s.get('tokens_per_s'), ' tokens/s', 4)} over "
        f"{_fmt(s.get('step_s'), ' s')} (rollout {_fmt(s.get('rollout_s'), ' s')}, "
        f"train {_fmt(s.get('train_s'), ' s')}, publish {_fmt(s.get('publish_s'), ' s')})",
        f"- **reward** {_fmt(s.get('reward'))}, success "
        f"{NA if s.get('success_rate') is None else format(s['success_rate'], '.0%')}, "
        f"loss {_fmt(s.get('loss'))}",
        f"- **serving SLO attainment** {slo_attainment(s)}; "
        f"**weights shipped** {_fmt(s.get('publish_bytes'))} bytes",
        f"- **trajectories** `{s.get('arrow_path', NA)}`",
        f"- **dashboards** `rose dashboard`, then {page_url(run=run_id)}",
    ]
    borrow = s.get("borrow") or {}
    if borrow:
        lines.append(f"- **borrowed serving workers** {', '.join(borrow['workers']) or 'none'}"
                     + (f" ({borrow['note']})" if borrow.get("note") else ""))
    if phases:
        lines.append("- **phases** " + ", ".join(f"{p}: {st}" for p, st in phases.items())
                     + (f" (reused from an earlier attempt: {', '.join(reused)})" if reused
                        else ""))
    return "\n".join(lines) + "\n"


def publish_step_artifacts(run_id: str, summary: dict) -> str:
    """Create both artifacts in the current flow run; returns the table's key."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    key = artifact_key(run_id, summary["step"])
    create_table_artifact(step_rows(summary), key=key,
                          description=f"{run_id} step {summary['step']}: throughput, reward, "
                                      "phase times, SLO attainment, transfer bytes")
    create_markdown_artifact(step_markdown(run_id, summary), key=f"{key}-summary",
                             description=f"{run_id} step {summary['step']} summary")
    return key


def publish_run_artifact(run_id: str, summaries: list[dict]) -> str | None:
    """One table over all steps of a train flow run (key `<run>-steps`)."""
    from prefect.artifacts import create_table_artifact

    if not summaries:
        return None
    key = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-") + "-steps"
    cols = ("step", "reward", "success_rate", "tokens_per_s", "step_s", "publish_bytes",
            "policy_version")
    rows = [{c: s.get(c) for c in cols} for s in summaries]
    create_table_artifact(rows, key=key, description=f"{run_id}: one row per RL step")
    return key
