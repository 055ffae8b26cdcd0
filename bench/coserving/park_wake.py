"""Park and wake of a serving worker's rollout engine, side by side with a cold start and with
serving alone (issue 39's acceptance).

One co-serving executor as a serving worker runs it (executors/coserving/executor.py, the demo
models). Measured in one run:
  cold start   a rollout engine built with its latency profile measured (a model's first start
               on a machine; later starts read the cached profile)
  cached start a rollout engine built from the cached profile (what `rose up` pays after that)
  wake         a parked engine brought back by the borrowing run's first weights (rebuild from
               the cached profile + the weights loaded): what a borrowed worker pays
  capacity     serving's KV pages: parked vs a serving-only executor (serving alone)
  SLO          the same Poisson serving requests (SLO = 2x serving-alone P99 TTFT/TPOT of this
               run) while the engine wakes in their middle, vs serving alone
On CPU the engine is destroyed when parked (vLLM's sleep mode needs CUDA's cumem allocator), so a
wake is a rebuild, which runs on the executor's loop thread and holds serving up meanwhile.

    ROSE_DATA_DIR=/tmp/pw .venv/bin/python -m bench.coserving.park_wake [--requests 60] [--rate 2]
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result


def poisson_requests(n: int, rate: float, seed: int) -> list:
    import numpy as np

    from core.trace import ReplayRequest

    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, size=n))
    prompts, outs = rng.integers(32, 256, size=n), rng.integers(8, 32, size=n)
    return [ReplayRequest(i, i, float(t[i]), float(t[i]), int(prompts[i]), int(outs[i]), int(prompts[i]),
                          int(outs[i])) for i in range(n)]


def serve(executor, requests: list, vocab: int, during=None) -> list:
    """Replay `requests` on the executor; `during()` (e.g. a wake) runs on a thread at the middle."""
    from replay.replayer import executor_sender, replay

    async def main():
        task = None
        if during is not None:
            async def later():
                await asyncio.sleep(requests[len(requests) // 2].send_at_s)
                return await asyncio.to_thread(during)
            task = asyncio.create_task(later())
        records = await replay(requests, executor_sender(executor), vocab, 0, prompt_low=3)
        return records, (await task if task else None)
    return asyncio.run(main())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=2.0, help="serving requests per second")
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--out", type=Path, default=RESULTS / "park_wake.json")
    args = ap.parse_args(argv)
    from rich.console import Console

    from executors.coserving.engines import open_engine, release_engine
    from executors.coserving.executor import CoServingConfig, CoServingExecutor
    from safetensors.torch import load_file
    from core.config import ModelsConfig
    from replay.replayer import summarize
    from bench.lib.models import ensure_models

    started, console = time.perf_counter(), Console()
    ensure_models(console)
    models = ModelsConfig()
    serving_dir, policy_dir = models.serving_path(), models.policy_path()
    vocab = int(__import__("json").loads((serving_dir / "config.json").read_text())["vocab_size"])
    requests = poisson_requests(args.requests, args.rate, seed=0)

    def cfg(mode: str) -> CoServingConfig:
        return CoServingConfig(serving_dir, policy_dir, mode=mode, kv_blocks=args.kv_blocks)

    # serving alone: its capacity and its latencies (the SLO is 2x its P99)
    with console.status("serving alone"):
        alone = CoServingExecutor(cfg("serving_only"), worker="serving-0")
        alone_pages = alone.total  # serving's whole pool, its cap with no rollout engine
        alone_records, _ = serve(alone, requests, vocab)
        alone.close()
    base = summarize(alone_records)
    slo_ttft, slo_tpot = 2 * base["ttft_p99_s"], 2 * base["tpot_p99_s"]

    # cold start (profile measured) vs cached start of a rollout engine, in a profile dir of its own
    with console.status("rollout engine: cold start, then cached start"):
        scratch = Path("/tmp") / f"park-wake-{int(time.time())}"
        shutil.copytree(policy_dir, scratch / "policy")
        c = CoServingConfig(serving_dir, scratch / "policy", mode="rose", kv_blocks=args.kv_blocks)
        starts = {}
        for kind in ("cold", "cached"):
            t0 = time.perf_counter()
            engine, _, _, source = open_engine(c, "rollout")
            starts[kind] = {"s": time.perf_counter() - t0, "profile": source}
            release_engine(engine)
        shutil.rmtree(scratch, ignore_errors=True)

    # park, then wake in the middle of the same serving requests
    with console.status("co-serving executor: park, then wake under serving traffic"):
        ex = CoServingExecutor(cfg("rose"), worker="serving-0")
        weights = load_file(str(next(policy_dir.glob("*.safetensors"))))  # what a run publishes
        up_cap = ex._call(ex._serving_cap)
        parked = ex.park()
        parked_cap = ex._call(ex._serving_cap)
        parked_pages = ex.total if parked_cap is None else parked_cap

        def wake() -> float:
            t0 = time.perf_counter()
            ex.load_rollout_weights(1, weights)
            return time.perf_counter() - t0
        wake_records, wake_s = serve(ex, requests, vocab, during=wake)
        state = ex.park_state()
        ex.close()
    during = summarize(wake_records, slo_ttft, slo_tpot)
    alone_slo = summarize(alone_records, slo_ttft, slo_tpot)
    result = {
        "cold_start_s": starts["cold"]["s"], "cached_start_s": starts["cached"]["s"], "wake_s": wake_s,
        "wake_s_executor": state["wake_s"], "cold_over_wake": starts["cold"]["s"] / wake_s,
        "serving_pages_alone": alone_pages, "serving_pages_parked": parked_pages,
        "serving_pages_rollout_up": up_cap, "pages_given_back": parked["pages_given_back"],
        "bytes_given_back": parked["kv_bytes_given_back"] + parked["weight_bytes_given_back"],
        "how": parked["how"], "slo_ttft_s": slo_ttft, "slo_tpot_s": slo_tpot,
        "attainment_alone": alone_slo["slo_attainment"], "attainment_during_wake": during["slo_attainment"],
        "ttft_p99_alone_s": base["ttft_p99_s"], "ttft_p99_during_wake_s": during["ttft_p99_s"],
        "requests": len(requests)}
    print_table("Park and wake of a serving worker's rollout engine (demo models, CPU: destroyed, not slept)",
                ("cold start s", "cached start s", "wake s", "cold / wake", "serving pages: alone / parked",
                 "SLO attained: alone / during wake", "TTFT P99 ms: alone / during wake"),
                [(f"{result['cold_start_s']:.2f}", f"{result['cached_start_s']:.2f}", f"{wake_s:.2f}",
                  f"{result['cold_over_wake']:.1f}x", f"{alone_pages} / {parked_pages}",
                  f"{result['attainment_alone']:.1%} / {result['attainment_during_wake']:.1%}",
                  f"{base['ttft_p99_s'] * 1e3:.0f} / {during['ttft_p99_s'] * 1e3:.0f}")])
    write_result(args.out, "park_wake", args, started, result=result, alone=alone_slo, during_wake=during)


if __name__ == "__main__":
    main()
