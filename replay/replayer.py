"""Replay a window of a serving trace against serving endpoints; record TTFT/TPOT per request.

Each request is sent at its planned time (core/trace.py) whatever happened to earlier
ones (an open loop, like real traffic). Two senders: HTTP streaming to OpenAI-compatible
endpoints (`rose serve replay`), and in-process to a co-serving executor (bench/coserving/coserving.py,
which skips HTTP so the client does not compete with the engine for the 2 cores).
Per request: TTFT = first streamed token - send; TPOT = (last token - first token) / (n - 1).
"""
from __future__ import annotations

import asyncio
from collections import Counter
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Awaitable, Callable

import numpy as np
from httpx_sse import aconnect_sse

from core.trace import ReplayRequest, synthetic_prompt
from storage.atomic import atomic_path, write_atomic


@dataclass
class RequestRecord:
    index: int
    trace_arrival_s: float
    send_at_s: float
    late_s: float  # actual send - planned send (the client keeping up)
    prompt_len: int
    max_tokens: int
    output_tokens: int = 0
    ttft_s: float = float("nan")
    tpot_s: float = float("nan")  # nan for one-token outputs
    e2e_s: float = float("nan")
    ok: bool = False
    error: str = ""
    endpoint: str = ""


Sender = Callable[[ReplayRequest, list[int], RequestRecord], Awaitable[None]]


async def replay(requests: list[ReplayRequest], send: Sender, vocab_size: int, seed: int = 0,
                 prompt_low: int = 0, stop: Callable[[], bool] | None = None) -> list[RequestRecord]:
    """Send every request at its send_at_s (open loop); returns one record per request sent.
    Once `stop()` is true no new request is sent; those in flight finish and are recorded."""
    prompts = [synthetic_prompt(r, vocab_size, seed, prompt_low) for r in requests]
    records = [RequestRecord(r.index, r.trace_arrival_s, r.send_at_s, 0.0, r.prompt_len,
                             r.max_tokens) for r in requests]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = []
    for req, prompt, rec in zip(requests, prompts, records):
        delay = t0 + req.send_at_s - loop.time()
        while delay > 0 and not (stop and stop()):
            await asyncio.sleep(min(delay, 0.25))
            delay = t0 + req.send_at_s - loop.time()
        if stop and stop():
            break
        rec.late_s = max(0.0, loop.time() - t0 - req.send_at_s)
        tasks.append(asyncio.create_task(_guarded(send, req, prompt, rec)))
    await asyncio.gather(*tasks)
    return records[:len(tasks)]


async def _guarded(send: Sender, req: ReplayRequest, prompt: list[int], rec: RequestRecord):
    try:
        await send(req, prompt, rec)
    except Exception as e:  # one failed request is a data point, not the end of the replay
        rec.ok, rec.error = False, f"{type(e).__name__}: {e}"[:300]


def http_sender(endpoints: list[str], model: str, client, temperature: float = 0.0) -> Sender:
    """Streams /v1/completions with ignore_eos; round-robin over endpoints by request index."""
    async def send(req: ReplayRequest, prompt: list[int], rec: RequestRecord) -> None:
        base = endpoints[req.index % len(endpoints)].rstrip("/")
        rec.endpoint = base
        body = {"model": model, "prompt": prompt, "max_tokens": req.max_tokens,
                "temperature": temperature, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        first = last = None
        chunks, usage = 0, None
        async with aconnect_sse(client, "POST", f"{base}/v1/completions", json=body) as source:
            resp = source.response
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                rec.error = f"HTTP {resp.status_code}: {text[:200]}"
                return
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    break
                obj = event.json()
                if "error" in obj:
                    rec.error = str(obj["error"].get("message", obj["error"]))[:300]
                    return
                if obj.get("usage"):
                    usage = obj["usage"]
                if obj.get("choices"):
                    now = time.perf_counter()
                    first = now if first is None else first
                    last, chunks = now, chunks + 1
        if first is None:
            rec.error = "stream ended without tokens"
            return
        n = int(usage["completion_tokens"]) if usage else chunks
        rec.output_tokens, rec.ttft_s, rec.e2e_s = n, first - start, last - start
        rec.tpot_s = (last - first) / (n - 1) if n > 1 else float("nan")
        rec.ok = True

    return send


def auth_headers() -> dict[str, str]:
    """The serving endpoints' key (ROSE_SERVING_API_KEY), as a client sends it; none if unset."""
    import os

    from executors.coserving.endpoint.api_keys import KEY_ENV

    key = os.environ.get(KEY_ENV, "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def replay_over_http(requests: list[ReplayRequest], endpoints: list[str], model: str,
                     vocab_size: int, seed: int = 0,
                     stop: Callable[[], bool] | None = None) -> list[RequestRecord]:
    """`replay` with the HTTP sender on a fresh event loop (blocks until the last reply)."""
    import httpx

    async def go():
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=limits,
                                     headers=auth_headers()) as client:
            return await replay(requests, http_sender(endpoints, model, client), vocab_size,
                                seed, stop=stop)

    return asyncio.run(go())


def executor_sender(executor, temperature: float = 0.0) -> Sender:
    """In-process: the executor's own timestamps (arrival = submit) give TTFT and TPOT."""
    async def send(req: ReplayRequest, prompt: list[int], rec: RequestRecord) -> None:
        rec.endpoint = "in-process"
        result = await asyncio.wrap_future(executor.submit_serving(
            prompt, req.max_tokens, ignore_eos=True, temperature=temperature))
        if getattr(result, "finish_reason", "length") not in ("stop", "length"):
            rec.error = f"finished {result.finish_reason}"
            return
        n = len(result.output_ids)
        rec.output_tokens, rec.ttft_s = n, float(result.ttft_s)
        times = list(getattr(result, "token_times", []) or [])
        rec.e2e_s = (times[-1] - result.arrival) if times else rec.ttft_s
        tpot = getattr(result, "tpot_s", None)
        rec.tpot_s = float(tpot) if (tpot is not None and n > 1) else float("nan")
        rec.ok = True

    return send


def _pct(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 6) if len(values) else None


def summarize(records: list[RequestRecord], ttft_slo_s: float | None = None,
              tpot_slo_s: float | None = None) -> dict:
    """Percentiles over successful requests; attainment over all (a failed request misses)."""
    ok = [r for r in records if r.ok]
    ttft = np.array([r.ttft_s for r in ok])
    tpot = np.array([r.tpot_s for r in ok if r.output_tokens > 1])
    out = {"requests": len(records), "ok": len(ok), "errors": len(records) - len(ok),
           "refused": sum(r.error.startswith("HTTP 503") for r in records),
           # what went wrong, most common first: a failed request names its cause
           "error_kinds": Counter(str(r.error)[:60] for r in records if not r.ok).most_common(),
           "output_tokens": int(sum(r.output_tokens for r in ok)),
           "late_p99_s": _pct(np.array([r.late_s for r in records]), 99)}
    for name, arr in (("ttft", ttft), ("tpot", tpot)):
        for q in (50, 95, 99):
            out[f"{name}_p{q}_s"] = _pct(arr, q)
    if ttft_slo_s is not None and tpot_slo_s is not None and records:
        def meets(r: RequestRecord) -> tuple[bool, bool]:
            if not r.ok:
                return False, False
            return r.ttft_s <= ttft_slo_s, r.output_tokens < 2 or r.tpot_s <= tpot_slo_s
        both = [meets(r) for r in records]
        out.update(slo_ttft_s=ttft_slo_s, slo_tpot_s=tpot_slo_s,
                   ttft_attainment=sum(a for a, _ in both) / len(records),
                   tpot_attainment=sum(b for _, b in both) / len(records),
                   slo_attainment=sum(a and b for a, b in both) / len(records))
    return out


def write_results(out_dir: str | Path, records: list[RequestRecord], summary: dict,
                  notice: str, meta: dict) -> dict[str, Path]:
    """requests.parquet (NOTICE in its schema metadata), summary.json (`trace_notice` field)
    and NOTICE.md: the attribution sits next to every derived file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([asdict(r) for r in records])
    table = table.replace_schema_metadata({"trace_notice": notice, "replay": json.dumps(meta)})
    paths = {"requests": out / "requests.parquet", "summary": out / "summary.json",
             "notice": out / "NOTICE.md"}
    with atomic_path(paths["requests"]) as tmp:
        pq.write_table(table, tmp)
    doc = {"summary": summary, "replay": meta, "trace_notice": notice}
    write_atomic(paths["summary"], json.dumps(doc, indent=2))
    write_atomic(paths["notice"], notice)
    return paths
