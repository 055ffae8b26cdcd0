"""`make demo` as a new user runs it: a fresh clone of this commit, `make demo`, N times in a row.

    .venv/bin/python -m bench.stack.demo_fresh --runs 3      # ~8-12 min a run on 2 cores (warm pip cache)

Each run clones HEAD into a new directory, runs `make demo` there (set-up, models, stack, the
serving-alone reference, the run under traffic), stops its stack (`make down`) and keeps the
run's summary (`.rose/runs/<run>/summary.json`: steps, serving users, the derived SLO) with its
wall time and the load average around it. One row per run: serving alone vs lent on the same
first 60 s, lent over the whole run, users refused (503), borrowed share of rollout tokens.
Results: bench/results/demo_fresh.json (each run's summary under `runs`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.lib.results import RESULTS, ROOT, print_table, write_result


def one_run(i: int, commit: str, workdir: Path, timeout_s: float) -> dict:
    clone = workdir / f"demo-{i}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROSE_", "VIRTUAL_ENV"))}
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    log = clone / "demo.log"
    try:
        with log.open("w") as out:
            rc = subprocess.run(["make", "demo"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                                timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    subprocess.run(["make", "down"], cwd=clone, env=env, capture_output=True, timeout=300)
    summaries = sorted((clone / ".rose" / "runs").glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    if rc != 0 or not summaries:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"run {i}: make demo ended {rc} with no summary; its log ends:\n{tail}")
    return {"commit": commit, "wall_s": wall, "load_avg_1m": [load0, load1],
            "summary": json.loads(summaries[-1].read_text())}


def row(i: int, run: dict) -> dict:
    users = run["summary"]["serving_users"]
    rows = users["rows"]
    alone, same, whole = (rows[k] for k in ("serving alone, first 60 s", "while lent, same 60 s",
                                            "while lent, whole run"))
    return {"run": i, "wall_s": run["wall_s"], "alone_60s": alone["slo_attainment"],
            "lent_60s": same["slo_attainment"], "lent_whole": whole["slo_attainment"],
            "requests": whole["requests"], "refused": sum(r.get("refused", 0) for r in rows.values()),
            "failed": whole["errors"], "borrowed_share": users["borrowed_share"],
            "slo_ttft_s": users["slo"]["slo_ttft_s"] if users.get("slo") else None,
            "slo_tpot_s": users["slo"]["slo_tpot_s"] if users.get("slo") else None,
            "slo_derivation": users.get("slo_derivation")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="per `make demo`")
    ap.add_argument("--out", type=Path, default=RESULTS / "demo_fresh.json")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    started = time.perf_counter()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    runs = []
    with tempfile.TemporaryDirectory(prefix="rose-demo-") as tmp:
        for i in range(1, args.runs + 1):
            runs.append(one_run(i, commit, Path(tmp), args.timeout_s))
            print(f"run {i}: {runs[-1]['wall_s'] / 60:.1f} min", flush=True)
    rows = [row(i, r) for i, r in enumerate(runs, 1)]
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    print_table(f"make demo from fresh clones of {commit[:7]}",
                ("run", "wall", "alone, 60 s", "lent, 60 s", "lent, run", "requests", "refused",
                 "failed", "borrowed"),
                [(str(r["run"]), f"{r['wall_s'] / 60:.1f} min", pct(r["alone_60s"]), pct(r["lent_60s"]),
                  pct(r["lent_whole"]), str(r["requests"]), str(r["refused"]), str(r["failed"]),
                  f"{r['borrowed_share']:.0%}") for r in rows])
    write_result(args.out, "demo_fresh", args, started, commit=commit, rows=rows, runs=runs)


if __name__ == "__main__":
    main()
