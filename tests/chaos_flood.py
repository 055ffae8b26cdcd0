"""A flood of concurrent streaming clients on a serving endpoint, from the local machine:
what each client got (admitted and served, refused with 429/503 and Retry-After, or failed),
the admitted requests' latency against the worker's own SLO, and the serving worker's memory
(RSS sampled by pid while the flood runs)."""
from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import numpy as np
import psutil
from distributed import Client


def _slo_and_pid(scheduler: str, worker: str) -> tuple[dict, int]:
    from executors.coserving.plugin import coserving_plugin

    def ask(dask_worker) -> tuple[dict, int]:  # client.run gives the worker: no task context here
        return coserving_plugin(dask_worker).executor.metrics()["slo"], os.getpid()

    with Client(scheduler, timeout=30) as client:
        address = next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                       if w["name"] == worker)
        return client.run(ask, workers=[address])[address]


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        super().__init__(name="rss", daemon=True)
        self.proc, self.every_s, self.samples = psutil.Process(pid), every_s, []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.samples.append(self.proc.memory_info().rss)
            except psutil.Error:
                return
            self.halt.wait(self.every_s)


async def _one(client, url: str, model: str, prompt: list[int], max_tokens: int) -> dict:
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0.0}
    t0 = time.perf_counter()
    times: list[float] = []
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return {"status": resp.status_code, "retry_after": resp.headers.get("retry-after")}
            async for line in resp.aiter_lines():
                if line.startswith("data:") and '"choices"' in line:
                    times.append(time.perf_counter())
        if not times:
            return {"status": 200, "error": "no tokens"}
        return {"status": 200, "ok": True, "ttft_s": times[0] - t0,
                "tpot_s": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None}
    except httpx.HTTPError as e:
        return {"status": None, "error": f"{type(e).__name__}: {e}"[:120]}


async def _flood(url: str, model: str, vocab: int, clients: int, max_tokens: int,
                 timeout_s: float) -> list[dict]:
    import httpx

    rng = random.Random(0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30),
                                 limits=limits) as client:
        prompts = [[rng.randrange(10, vocab) for _ in range(32)] for _ in range(clients)]
        return await asyncio.gather(*(_one(client, url, model, p, max_tokens)
                                      for p in prompts))


def flood(scheduler: str, worker: str, url: str, clients: int = 1000, max_tokens: int = 16,
          timeout_s: float = 120.0) -> dict:
    """`clients` streaming completions at once on `url`; a summary of what they got."""
    from replay.job import endpoint_model

    model = endpoint_model(url)
    slo, pid = _slo_and_pid(scheduler, worker)
    rss = RssSampler(pid)
    rss.start()
    time.sleep(1.0)  # a baseline before the flood
    base = max(rss.samples or [0])
    t0 = time.monotonic()
    results = asyncio.run(_flood(url.rstrip("/"), model["id"], int(model["vocab_size"]),
                                 clients, max_tokens, timeout_s))
    wall = time.monotonic() - t0
    rss.halt.set()
    rss.join(5)
    ok = [r for r in results if r.get("ok")]
    refused = [r for r in results if r["status"] in (429, 503)]
    ttft = np.array([r["ttft_s"] for r in ok])
    tpot = np.array([r["tpot_s"] for r in ok if r.get("tpot_s") is not None])
    met = sum(r["ttft_s"] <= slo["ttft_s"] and (r.get("tpot_s") is None
                                               or r["tpot_s"] <= slo["tpot_s"]) for r in ok)
    pct = lambda a, q: round(float(np.percentile(a, q)), 4) if len(a) else None  # noqa: E731
    return {"clients": clients, "flood_s": round(wall, 1), "admitted_ok": len(ok),
            "refused": len(refused),
            "refused_with_retry_after": sum(bool(r.get("retry_after")) for r in refused),
            "refused_codes": sorted({r["status"] for r in refused}),
            "failed": len(results) - len(ok) - len(refused),
            "failed_errors": sorted({r.get("error", str(r["status"])) for r in results
                                     if not r.get("ok") and r not in refused})[:5],
            "admitted_ttft_p99_s": pct(ttft, 99), "admitted_tpot_p99_s": pct(tpot, 99),
            "slo": {k: slo[k] for k in ("ttft_s", "tpot_s")},
            "admitted_slo_met": round(met / len(ok), 4) if ok else None,
            "rss_before_mb": round(base / 2**20), "rss_peak_mb": round(max(rss.samples) / 2**20)}
