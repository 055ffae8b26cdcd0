"""Per-step metrics as TensorBoard event files (`tensorboard --logdir <run dir>/tensorboard`),
as users of verl and ROLL expect: step scalars under `step/`, each serving worker's under
`serving/<worker>/`, the RL step as TensorBoard's global step."""
from __future__ import annotations

import atexit
import threading
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


_writers: dict[str, object] = {}  # log dir -> this process's SummaryWriter for it
_lock = threading.Lock()


def write_events(log_dir: Path | str, summary: dict) -> Path:
    """Append the step's scalars to this process's event file under `log_dir`.

    One file per process and directory, flushed after every step: TensorBoard reads a
    directory's files in name order (start second, host, pid, then a per-process counter, which
    sorts "10" before "9"), so a file per step could put step 2 before step 1, and readers that
    purge out-of-order steps would drop data. A resumed run's process starts a later file."""
    from torch.utils.tensorboard import SummaryWriter

    key = str(Path(log_dir).resolve())
    with _lock:
        writer = _writers.get(key)
        if writer is None:
            writer = _writers[key] = SummaryWriter(log_dir=key)
        for tag, value in scalars(summary).items():
            writer.add_scalar(tag, value, global_step=summary["step"])
        writer.flush()
    return Path(log_dir)


@atexit.register
def close_writers() -> None:
    with _lock:
        for writer in _writers.values():
            writer.close()
        _writers.clear()
