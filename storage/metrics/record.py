"""What the train flow calls at each step's end: the step-metric tables and TensorBoard events."""
from __future__ import annotations

from pathlib import Path

from storage.metrics.store import METRICS_DIR, StepMetricsStore
from storage.metrics.tensorboard import write_events

TENSORBOARD_DIR = "tensorboard"  # <run dir>/tensorboard: that run's event files


def record_step(data_dir: Path | str, run_dir: Path | str, run: str, summary: dict) -> None:
    StepMetricsStore(Path(data_dir) / METRICS_DIR).write_step(run, summary)
    write_events(Path(run_dir) / TENSORBOARD_DIR, summary)
