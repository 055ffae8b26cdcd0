"""`rose serve replay`: pick a window of the trace, scale it, replay it over HTTP, write results."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.table import Table

from core.config import data_dir
from replay.replayer import auth_headers, replay_over_http, summarize, write_results
from core.trace import (DEFAULT_TRACE, Scaling, load_trace, peak_window_start, plan,
                              trace_notice)


def endpoint_model(url: str) -> dict:
    """The served model's name, context and vocabulary, from GET /v1/models."""
    try:
        resp = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=10, headers=auth_headers())
        resp.raise_for_status()
        return resp.json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ConnectionError(f"endpoint {url} does not answer GET /v1/models: {e}") from None


def choose_window(trace, start: float | None, duration: float, around_peak: bool) -> float:
    if around_peak:
        if start is not None:
            raise ValueError("give either --start or --around-peak, not both")
        return peak_window_start(trace, duration)
    start = 0.0 if start is None else start
    if not 0 <= start <= trace.span_s:
        raise ValueError(f"--start {start} s is outside the trace (0 to {trace.span_s:.0f} s)")
    return start


class ReplayJob(BaseModel):
    """One replay: endpoints, trace window, scales, SLOs (the `rose serve replay` options and
    the `serving-replay` deployment's form, validated the same way)."""
    model_config = ConfigDict(extra="forbid")
    endpoints: list[str] = Field(..., min_length=1)  # OpenAI-compatible base URLs
    trace: Path = DEFAULT_TRACE
    start_s: float | None = Field(None, ge=0)  # default: the trace's start
    duration_s: float = Field(600.0, gt=0)  # trace seconds
    around_peak: bool = False
    time_scale: float = Field(1.0, gt=0)  # replay seconds per trace second
    length_scale: float = Field(1.0, gt=0)
    output_scale: float | None = Field(None, gt=0)  # default: length_scale
    sample: float = Field(1.0, gt=0, le=1)
    seed: int = 0
    slo_ttft_s: float | None = Field(None, gt=0)
    slo_tpot_s: float | None = Field(None, gt=0)
    vocab_size: int | None = Field(None, ge=2)  # default: the endpoint's
    max_model_len: int | None = Field(None, ge=16)  # default: the endpoint's
    out_dir: Path | None = None  # default: <data>/replay/<timestamp>

    @model_validator(mode="after")
    def _window(self) -> "ReplayJob":
        if self.around_peak and self.start_s is not None:
            raise ValueError("give either --start or --around-peak (start_s, around_peak), not both")
        return self


def run_replay(job: ReplayJob, console: Console) -> dict:
    """Replay the job's window over HTTP; print and write the results (with the NOTICE)."""
    notice = trace_notice(job.trace)
    model = endpoint_model(job.endpoints[0])
    vocab = job.vocab_size or model.get("vocab_size")
    if not vocab:
        raise ValueError(f"endpoint {job.endpoints[0]} does not report vocab_size: pass --vocab-size")
    context = int(job.max_model_len or model.get("max_model_len") or 2048)
    trace = load_trace(job.trace)
    t0 = choose_window(trace, job.start_s, job.duration_s, job.around_peak)
    scaling = Scaling(job.time_scale, job.length_scale, job.output_scale, job.sample, context,
                      job.seed)
    requests = plan(trace.window(t0, job.duration_s), scaling, start_s=t0)
    if not requests:
        raise ValueError(f"no requests in the window [{t0:.1f}, {t0 + job.duration_s:.1f}) s of "
                         "the trace")
    console.print(f"replaying {len(requests)} requests of trace window [{t0:.1f}, "
                  f"{t0 + job.duration_s:.1f}) s over {job.duration_s * job.time_scale:.1f} s to "
                  f"{len(job.endpoints)} endpoint(s), model {model['id']}")
    records = replay_over_http(requests, job.endpoints, model["id"], int(vocab), job.seed)
    summary = summarize(records, job.slo_ttft_s, job.slo_tpot_s)
    meta = {**job.model_dump(mode="json", exclude={"out_dir"}), "window_start_s": t0,
            "output_scale": scaling.outputs, "max_model_len": context, "model": model["id"]}
    out = job.out_dir or data_dir() / "replay" / time.strftime("%Y%m%d-%H%M%S")
    paths = write_results(out, records, summary, notice, meta)
    print_summary(summary, console)
    console.print(f"results: {paths['requests']}, {paths['summary']} (with the trace NOTICE)")
    return {**summary, "out_dir": str(out)}


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def print_summary(summary: dict, console: Console) -> None:
    table = Table(title="trace replay (ms)")
    for col in ("requests", "errors", "TTFT p50", "p95", "p99", "TPOT p50", "p95", "p99",
                "SLO attained"):
        table.add_column(col, justify="right")
    att = summary.get("slo_attainment")
    table.add_row(str(summary["requests"]), str(summary["errors"]),
                  *(_ms(summary[f"ttft_p{q}_s"]) for q in (50, 95, 99)),
                  *(_ms(summary[f"tpot_p{q}_s"]) for q in (50, 95, 99)),
                  "-" if att is None else f"{att:.1%}")
    console.print(table)
