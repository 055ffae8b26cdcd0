"""`rose serve replay`: pick a window of the trace, scale it, replay it over HTTP, write results."""
from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from rose.serve.replay import http_sender, replay, summarize, write_results
from rose.serve.trace import Scaling, load_trace, peak_window_start, plan, trace_notice


def endpoint_model(url: str) -> dict:
    """The served model's name, context and vocabulary, from GET /v1/models."""
    try:
        resp = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=10)
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


def run_replay(endpoints: list[str], trace_path: Path, out_dir: Path, start: float | None,
               duration: float, around_peak: bool, time_scale: float, length_scale: float,
               output_scale: float | None, sample: float, seed: int,
               ttft_slo_s: float | None, tpot_slo_s: float | None, vocab_size: int | None,
               max_model_len: int | None, console: Console) -> dict:
    if not endpoints:
        raise ValueError("give at least one --endpoint URL")
    notice = trace_notice(trace_path)
    model = endpoint_model(endpoints[0])
    vocab = vocab_size or model.get("vocab_size")
    if not vocab:
        raise ValueError(f"endpoint {endpoints[0]} does not report vocab_size: pass --vocab-size")
    context = int(max_model_len or model.get("max_model_len") or 2048)
    trace = load_trace(trace_path)
    t0 = choose_window(trace, start, duration, around_peak)
    window = trace.window(t0, duration)
    scaling = Scaling(time_scale, length_scale, output_scale, sample, context, seed)
    requests = plan(window, scaling, start_s=t0)
    if not requests:
        raise ValueError(f"no requests in the window [{t0:.1f}, {t0 + duration:.1f}) s of the trace")
    console.print(f"replaying {len(requests)} requests of trace window [{t0:.1f}, "
                  f"{t0 + duration:.1f}) s over {duration * time_scale:.1f} s to "
                  f"{len(endpoints)} endpoint(s), model {model['id']}")

    async def go():
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10),
                                     limits=limits) as client:
            return await replay(requests, http_sender(endpoints, model["id"], client),
                                int(vocab), seed)

    records = asyncio.run(go())
    summary = summarize(records, ttft_slo_s, tpot_slo_s)
    meta = {"trace": str(trace_path), "window_start_s": t0, "window_s": duration,
            "around_peak": around_peak, "time_scale": time_scale, "length_scale": length_scale,
            "output_scale": scaling.outputs, "sample": sample, "seed": seed,
            "max_model_len": context, "endpoints": endpoints, "model": model["id"]}
    paths = write_results(out_dir, records, summary, notice, meta)
    print_summary(summary, console)
    console.print(f"results: {paths['requests']}, {paths['summary']} (with the trace NOTICE)")
    return summary


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
