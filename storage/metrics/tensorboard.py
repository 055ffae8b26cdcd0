"""Per-step metrics as TensorBoard event files (`tensorboard --logdir <run dir>/tensorboard`),
as users of verl and ROLL expect: step scalars under `step/`, each serving worker's under
`serving/<worker>/`, the RL step as TensorBoard's global step."""
from __future__ import annotations

from pathlib import Path

STEP_SCALARS = ("reward", "success_rate", "tokens_per_s", "prefix_cache_hit_rate", "rollout_s",
                "reward_s", "train_s", "publish_s", "step_s", "loss", "grad_norm",
                "publish_bytes", "policy_version", "rerouted_turns", "borrowed_share",
                "serving_requests", "slo_attainment")
SERVING_SCALARS = ("requests", "failed", "ttft_p99_s", "tpot_p99_s", "slo_attainment",
                   "rollout_admitted", "rollout_aborted")


def scalars(summary: dict) -> dict[str, float]:
    """tag -> value for every number the step has (missing and null values are left out)."""
    out = {f"step/{k}": summary[k] for k in STEP_SCALARS if summary.get(k) is not None}
    for worker, report in sorted((summary.get("serving") or {}).items()):
        out.update({f"serving/{worker}/{k}": report[k] for k in SERVING_SCALARS
                    if report.get(k) is not None})
    return {tag: float(v) for tag, v in out.items()}


def write_events(log_dir: Path | str, summary: dict) -> Path:
    """Append the step's scalars to an event file under `log_dir` (one file per call)."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(log_dir)) as writer:
        for tag, value in scalars(summary).items():
            writer.add_scalar(tag, value, global_step=summary["step"])
    return Path(log_dir)
