"""The `benchmarks` deployment: run the bench/<family>/*.py scripts and show their results as artifacts.

Each script is run as its own process, `python -m bench.<family>.<name>` from the repo root (they
start their own services and time themselves),
with the arguments given; the JSON files it writes under bench/results become one markdown
artifact per script, next to the tail of what it printed.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field, field_validator

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
# scripts of bench/ that read results instead of measuring: the plots and the results doc
RESULT_READERS = re.compile(r".+_plot|results_doc")


def benchmark_scripts() -> dict[str, Path]:
    """The runnable benchmarks by name: bench/<family>/<name>.py scripts with a __main__ (each
    prints a table and writes its JSON under bench/results); not the modules they share (bench/lib
    among them), nor the scripts that read their results. Names are unique across families."""
    return {p.stem: p for p in sorted(BENCH_DIR.glob("*/*.py"))
            if p.parent.name != "lib" and not RESULT_READERS.fullmatch(p.stem)
            and '__name__ == "__main__"' in p.read_text(encoding="utf-8")}


def benchmark_names() -> list[str]:
    """The names `BenchRequest.scripts` takes: the stems of benchmark_scripts()."""
    return sorted(benchmark_scripts())


def bench_module(name: str) -> str:
    """The module `python -m` runs for benchmark `name`: bench.<family>.<name>."""
    return f"bench.{benchmark_scripts()[name].parent.name}.{name}"


class BenchRequest(BaseModel):
    """Which benchmark scripts to run (names of bench/<family>/<name>.py) and with what arguments."""

    model_config = ConfigDict(extra="forbid")
    scripts: list[str] = Field(default_factory=lambda: ["scheduler"], min_length=1)
    args: dict[str, list[str]] = Field(default_factory=dict)  # script -> extra CLI arguments
    timeout_s: int = Field(1800, ge=10)

    @field_validator("scripts")
    @classmethod
    def _known(cls, scripts: list[str]) -> list[str]:
        have = benchmark_names()
        for name in scripts:
            if name not in have:
                raise ValueError(f"no benchmark {name!r} (have: {', '.join(have)})")
        return scripts


def _results_since(t0: float) -> dict[str, dict]:
    out = {}
    for path in sorted((BENCH_DIR / "results").glob("*.json")):
        if path.stat().st_mtime >= t0:
            try:
                out[path.name] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
    return out


@task(name="bench", cache_policy=NO_CACHE)
def run_bench(name: str, args: list[str], timeout_s: int) -> dict:
    from prefect.artifacts import create_markdown_artifact

    t0 = time.time()
    module = bench_module(name)
    proc = subprocess.run([sys.executable, "-m", module, *args],
                          cwd=BENCH_DIR.parent, capture_output=True, text=True, timeout=timeout_s)
    seconds = time.time() - t0
    results = _results_since(t0)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
    body = [f"### python -m {module} {' '.join(args)}", "",
            f"exit code {proc.returncode}, {seconds:.1f} s", "", "```", tail, "```"]
    for fname, data in results.items():
        body += ["", f"**{fname}**", "", "```json", json.dumps(data, indent=1)[:20000], "```"]
    create_markdown_artifact("\n".join(body), key=f"bench-{name.replace('_', '-')}",
                             description=module)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} exited {proc.returncode}: "
                           f"{tail.splitlines()[-1] if tail else 'no output'}")
    return {"script": name, "seconds": seconds, "results": sorted(results)}


@flow(name="benchmarks", log_prints=True)
def benchmarks(request: BenchRequest = BenchRequest()) -> list[dict]:
    """Run the requested benchmark scripts one after the other (they time the machine)."""
    return [run_bench(name, request.args.get(name, []), request.timeout_s)
            for name in request.scripts]
