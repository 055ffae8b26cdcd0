"""The serving endpoint fuzzed at length, on a real engine, with users beside it (issue 41).

    .venv/bin/python -m bench.coserving.endpoint_fuzz --requests 2000      # ~5 min on 2 cores

A serving executor (the built Qwen2 serving model, vLLM) behind its keyed endpoint; a replay of
the code trace's first --users-s seconds sends users alone first (the reference), then again,
pass after pass, while from another process hypothesis draws
`--requests` request bodies (tests/fuzz_requests.py: bytes, JSON, near-valid completions and chat
with wrong types, out-of-range numbers, ids outside the vocabulary, streaming) and posts them one
at a time, one in ten without the key. Counted by status class; a 5xx, an unkeyed request not
answered 401, or a stream without [DONE] is a finding. The users' P99 TTFT/TPOT and attainment
against the executor's SLO, alone and beside the fuzzer. The fuzzing process runs niced by
default (--fuzzer-nice 19), standing for a client on another host; at nice 0 on 2 cores it takes
a core from the engine, which is then what the users measure. Results: bench/results/endpoint_fuzz.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result

KEY = "sk-bench-fuzz"


def fuzz(url: str, model: str, vocab: int, context: int, n: int, max_out: int) -> dict:
    """Post `n` generated requests to `url`, one at a time; counts by status class and findings."""
    import httpx
    from hypothesis import HealthCheck, given, settings

    import fuzz_requests

    counts: Counter[str] = Counter()
    findings: list[dict] = []
    with httpx.Client(timeout=60) as client:
        @settings(max_examples=n, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(request=fuzz_requests.requests(model, vocab, context, max_out))
        def post(request) -> None:
            path, body = request
            keyed = counts["sent"] % 10 != 9  # one in ten without the key: 401 expected
            headers = {"Content-Type": "application/json",
                       **({"Authorization": f"Bearer {KEY}"} if keyed else {})}
            r = client.post(url + path, content=body, headers=headers)
            text = r.text  # a stream is read to its end: no hang
            counts["sent"] += 1
            counts[f"{r.status_code // 100}xx"] += 1
            if not keyed:
                counts["unkeyed"] += 1
                counts["unkeyed_401"] += r.status_code == 401
            stream = "text/event-stream" in r.headers.get("content-type", "")
            if r.status_code >= 500 or (not keyed and r.status_code != 401) or (
                    stream and not text.rstrip().endswith("data: [DONE]")):
                findings.append({"path": path, "status": r.status_code, "keyed": keyed,
                                 "body": (body if isinstance(body, str) else repr(body))[:300],
                                 "answer": text[:300]})

        post()
    return {"counts": dict(counts), "findings": findings}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="fuzzed requests to send")
    ap.add_argument("--max-out", type=int, default=64, help="largest valid max_tokens drawn")
    ap.add_argument("--traffic-sample", type=float, default=0.25, help="share of the trace's users replayed")
    ap.add_argument("--fuzzer-nice", type=int, default=19,
                    help="nice of the fuzzing process: 19 stands for a client on another host (it takes only "
                         "CPU the engine leaves idle); 0 lets it compete for the cores")
    ap.add_argument("--users-s", type=float, default=30.0, help="seconds of the users' window, alone first")
    ap.add_argument("--out", type=Path, default=RESULTS / "endpoint_fuzz.json")
    ap.add_argument("--client", default=None, help=argparse.SUPPRESS)  # JSON: the fuzzing process's job
    args = ap.parse_args(argv)
    if args.client:
        job = json.loads(args.client)
        print(json.dumps(fuzz(**job)))
        return
    if args.requests < 1:
        ap.error("--requests must be >= 1")
    started = time.perf_counter()

    import httpx

    from executors.coserving.endpoint.app import start_endpoint, stop_endpoint
    from executors.coserving.executor import CoServingConfig, CoServingExecutor
    from core.config import ModelsConfig
    from replay.background import BackgroundReplay, BackgroundTraffic

    models = ModelsConfig()
    serving = models.serving_path()
    if not (serving / "config.json").is_file():
        raise SystemExit(f"no serving model in {serving}: run `rose models build` first")
    config = json.loads((serving / "config.json").read_text())
    executor = CoServingExecutor(CoServingConfig(serving, models.policy_path(), mode="serving_only"),
                                 worker="fuzz-0")
    ep = start_endpoint(executor, serving, worker="fuzz-0", api_keys=(KEY,))
    os.environ["ROSE_SERVING_API_KEY"] = KEY  # the users' replay sends it
    try:
        # the same users first alone (the reference), then beside the fuzzer, pass after pass
        traffic = BackgroundTraffic(sample=args.traffic_sample, period_s=args.users_s / 0.125)
        alone = BackgroundReplay([ep.url], replace(traffic, window_s=traffic.period_s)).play()
        users = BackgroundReplay([ep.url], traffic)
        job = {"url": ep.url, "model": serving.name, "vocab": int(config["vocab_size"]),
               "context": int(executor.cfg.max_model_len), "n": args.requests, "max_out": args.max_out}
        with users:  # the fuzzer is another process, as a client elsewhere would be
            done = subprocess.run([sys.executable, "-m", __spec__.name, "--client", json.dumps(job)],
                                  capture_output=True, text=True, timeout=3600,
                                  preexec_fn=(lambda: os.nice(args.fuzzer_nice)) if args.fuzzer_nice else None)
        if done.returncode != 0:
            raise SystemExit(f"the fuzzing process failed:\n{done.stderr[-2000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        slo = executor.slo
        served, reference = users.summary_at(slo.ttft_s, slo.tpot_s), alone.summary_at(slo.ttft_s, slo.tpot_s)
        after = httpx.post(ep.url + "/v1/completions", timeout=60, headers={"Authorization": f"Bearer {KEY}"},
                           json={"model": serving.name, "prompt": [5, 6, 7], "max_tokens": 4})
    finally:
        stop_endpoint("fuzz-0")
        executor.close()
    counts, findings = result["counts"], result["findings"]
    rows = [[k, f"{counts.get(k, 0):,}"] for k in ("sent", "2xx", "4xx", "5xx", "unkeyed", "unkeyed_401")]
    rows += [["findings (5xx, unkeyed not 401, stream without [DONE])", str(len(findings))],
             *[[f"users {name}: requests, P99 TTFT / TPOT, within SLO",
                f"{u['requests']:,}, {1e3 * u['ttft_p99_s']:.0f} / {1e3 * u['tpot_p99_s']:.0f} ms, "
                f"{u['slo_attainment']:.1%}"] for name, u in (("alone", reference), ("beside the fuzzer", served))],
             ["SLO (the executor's, from its profile)", f"{1e3 * slo.ttft_s:.0f} / {1e3 * slo.tpot_s:.0f} ms"],
             ["serves afterwards", str(after.status_code == 200)]]
    print_table(f"Endpoint fuzz: {args.requests:,} generated requests on a real engine, users beside",
                ["what", "count"], rows)
    write_result(args.out, "endpoint_fuzz", args, started, counts=counts, findings=findings,
                 users=served, users_alone=reference, slo={"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
                 serves_after=after.status_code == 200)


if __name__ == "__main__":
    main()
