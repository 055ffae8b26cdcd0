"""The `serving-replay` deployment: replay a window of a serving trace against endpoints.

Wraps rose/serve/replay_run.py (the same code as `rose serve replay`); the request form is a
pydantic model, so the Prefect UI validates it, and the TTFT/TPOT percentiles and SLO
attainment become a table artifact.
"""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rose.config import data_dir


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    endpoints: list[str] = Field(..., min_length=1)  # OpenAI-compatible base URLs
    trace: Path | None = None  # default: the Azure 2023 code trace
    start_s: float | None = Field(None, ge=0)
    duration_s: float = Field(60.0, gt=0)
    around_peak: bool = False
    time_scale: float = Field(1.0, gt=0)
    length_scale: float = Field(1.0, gt=0)
    output_scale: float | None = Field(None, gt=0)
    sample: float = Field(1.0, gt=0, le=1)
    seed: int = 0
    slo_ttft_s: float | None = Field(0.5, gt=0)
    slo_tpot_s: float | None = Field(0.15, gt=0)
    vocab_size: int | None = Field(None, ge=2)
    max_model_len: int | None = Field(None, ge=16)
    out_dir: Path | None = None  # default: <data>/replay/<timestamp>

    @model_validator(mode="after")
    def _window(self) -> "ReplayRequest":
        if self.around_peak and self.start_s is not None:
            raise ValueError("give either start_s or around_peak, not both")
        return self


def summary_rows(summary: dict) -> list[dict]:
    def ms(v):
        return "n/a" if v is None else f"{v * 1000:.1f} ms"

    rows = [("requests", summary["requests"]), ("errors", summary["errors"])]
    rows += [(f"{m.upper()} p{q}", ms(summary.get(f"{m}_p{q}_s")))
             for m in ("ttft", "tpot") for q in (50, 95, 99)]
    att = summary.get("slo_attainment")
    rows.append(("SLO attainment", "n/a" if att is None else f"{att:.1%}"))
    return [{"metric": k, "value": str(v)} for k, v in rows]


@flow(name="serving-replay", log_prints=True)
def serving_replay(request: ReplayRequest) -> dict:
    from prefect.artifacts import create_table_artifact
    from rich.console import Console

    from rose.serve.replay_run import run_replay
    from rose.serve.trace import DEFAULT_TRACE

    out = request.out_dir or data_dir() / "replay" / time.strftime("%Y%m%d-%H%M%S")
    summary = run_replay(request.endpoints, request.trace or DEFAULT_TRACE, out, request.start_s,
                         request.duration_s, request.around_peak, request.time_scale,
                         request.length_scale, request.output_scale, request.sample,
                         request.seed, request.slo_ttft_s, request.slo_tpot_s,
                         request.vocab_size, request.max_model_len, Console(width=120))
    create_table_artifact(summary_rows(summary), key="serving-replay",
                          description=f"trace replay against {', '.join(request.endpoints)}; "
                                      f"files in {out}")
    return summary
