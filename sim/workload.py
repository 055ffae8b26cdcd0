"""Workloads: agentic trajectories fitted from the project's Arrow data, serving arrivals from a
trace, and the RL step's train/publish times from a simple model.

A trajectory is drawn from empirical distributions (21 quantiles each, sampled by inverse CDF)
of the turns recorded by real runs: turns per trajectory, the first prompt's tokens, the
observation tokens each later turn appends, response tokens per turn, environment seconds per
turn, and whether the trajectory succeeded. `fit_from_arrow` computes them with DuckDB over the
dataset (rose query's view); the fit shipped in sim/profiles/workload_frozenlake.json says which
runs it came from.
"""
from __future__ import annotations

import bisect
import json
import math
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.trace import DEFAULT_TRACE, load_trace

QUANTILES = [i / 20 for i in range(21)]
WORKLOAD_FILE = Path(__file__).resolve().parent / "profiles" / "workload_frozenlake.json"
_COLUMNS = {  # distribution -> SQL over per-turn rows (d: observation tokens a turn appends)
    "turns": "SELECT count(*) FROM turns GROUP BY run, trajectory",
    "first_prompt": "SELECT num_prompt_tokens FROM turns WHERE turn = 0",
    "obs_tokens": ("SELECT d FROM (SELECT num_prompt_tokens - lag(num_prompt_tokens + len(response_ids)) "
                   "OVER (PARTITION BY run, trajectory ORDER BY turn) AS d FROM turns) WHERE d IS NOT NULL"),
    "response": "SELECT len(response_ids) FROM turns",
    "env_s": "SELECT env_s FROM turns",
    # orchestration between a turn's environment answer and the next turn's start (the Dask
    # round trip of the per-turn dispatch, tokenization, scheduling): start_n - (end_n-1 + env)
    "dispatch_s": ("SELECT gap FROM (SELECT epoch(finished_at) - decode_s - prefill_s - queued_s "
                   "- lag(epoch(finished_at) + env_s) OVER (PARTITION BY run, trajectory "
                   "ORDER BY turn) AS gap FROM turns) WHERE gap IS NOT NULL"),
}
# per step: the rollout phase's seconds beyond its turns' span (task start, weight-version
# wait, group launch, the Arrow write), from the step metrics beside the turns
_ROLLOUT_OVERHEAD = (
    "SELECT median(GREATEST(s.rollout_s - t.span, 0)) FROM steps s JOIN (SELECT run, step, "
    "max(epoch(finished_at)) - min(epoch(finished_at) - decode_s - prefill_s - queued_s) AS span "
    "FROM turns GROUP BY run, step) t USING (run, step)")


@dataclass(frozen=True)
class Trajectory:
    first_prompt: int
    obs: tuple[int, ...]  # tokens appended before turns 1..n-1
    responses: tuple[int, ...]  # response tokens of turns 0..n-1
    env_s: tuple[float, ...]  # environment time after each turn
    dispatch_s: tuple[float, ...]  # orchestration before turns 1..n-1
    success: bool

    @property
    def turns(self) -> int:
        return len(self.responses)


class WorkloadSpec:
    """Per-trajectory distributions (_COLUMNS), plus, optionally: "response_scale", one draw per
    trajectory multiplying all its responses (a model that thinks long on a task does so every
    turn, which is what makes whole trajectories long-tailed), `max_context` (the model's
    context length: the turn that reaches it is cut there and ends the trajectory) and
    `citations` (where each parameter comes from)."""

    def __init__(self, quantiles: dict[str, list[float]], success_rate: float, source: str = "",
                 rollout_overhead_s: float = 0.0, max_context: int | None = None,
                 citations: dict[str, str] | None = None) -> None:
        missing = set(_COLUMNS) - set(quantiles)
        if missing:
            raise ValueError(f"workload lacks distributions {sorted(missing)}")
        unknown = set(quantiles) - set(_COLUMNS) - {"response_scale"}
        if unknown:
            raise ValueError(f"workload has unknown distributions {sorted(unknown)}")
        if rollout_overhead_s < 0:
            raise ValueError(f"rollout_overhead_s must be >= 0, got {rollout_overhead_s}")
        if max_context is not None and max_context < 2:
            raise ValueError(f"max_context must be >= 2 tokens, got {max_context}")
        for k, v in quantiles.items():
            if len(v) != len(QUANTILES) or any(b < a for a, b in zip(v, v[1:])):
                raise ValueError(f"distribution {k!r} needs {len(QUANTILES)} non-decreasing quantiles")
        self.q = {k: np.asarray(v, dtype=float) for k, v in quantiles.items()}
        self.success_rate, self.source = success_rate, source
        self.rollout_overhead_s, self.max_context = rollout_overhead_s, max_context
        self.citations = dict(citations or {})
        # per distribution: its values and segment slopes as Python floats, for _draw
        self._segments = {k: (tuple(map(float, v)), tuple(float((v[j + 1] - v[j]) / (QUANTILES[j + 1] - QUANTILES[j]))
                                                          for j in range(len(v) - 1)))
                          for k, v in self.q.items()}

    def _draw(self, rng: random.Random, name: str) -> float:
        """Inverse CDF at a uniform draw: np.interp's arithmetic (same slope, same order of
        operations, so the same bits; tests/test_sim_serving.py checks) without its per-call array
        overhead, which was a tenth of a 1,024-GPU run."""
        x = rng.random()
        ys, slopes = self._segments[name]
        j = bisect.bisect_right(QUANTILES, x) - 1
        if j >= len(slopes):
            return ys[-1]
        if QUANTILES[j] == x:
            return ys[j]
        return slopes[j] * (x - QUANTILES[j]) + ys[j]

    def sample(self, rng: random.Random) -> Trajectory:
        n = max(1, round(self._draw(rng, "turns")))
        first = max(1, round(self._draw(rng, "first_prompt")))
        obs = tuple(max(1, round(self._draw(rng, "obs_tokens"))) for _ in range(n - 1))
        scale = self._draw(rng, "response_scale") if "response_scale" in self.q else 1.0
        responses = tuple(max(1, round(scale * self._draw(rng, "response"))) for _ in range(n))
        env = tuple(max(0.0, self._draw(rng, "env_s")) for _ in range(n))
        dispatch = tuple(max(0.0, self._draw(rng, "dispatch_s")) for _ in range(n - 1))
        success = rng.random() < self.success_rate
        if self.max_context is not None:
            first, obs, responses = _cut(first, obs, responses, self.max_context)
            n = len(responses)
        return Trajectory(first, obs[:n - 1], responses, env[:n], dispatch[:n - 1], success)

    def to_json(self) -> str:
        d = {"source": self.source, "success_rate": self.success_rate,
             "rollout_overhead_s": self.rollout_overhead_s}
        if self.max_context is not None:
            d["max_context"] = self.max_context
        if self.citations:
            d["citations"] = self.citations
        d["quantiles"] = {k: [round(float(x), 6) for x in v] for k, v in self.q.items()}
        return json.dumps(d, indent=1)

    @classmethod
    def load(cls, path: str | Path = WORKLOAD_FILE) -> "WorkloadSpec":
        d = json.loads(Path(path).read_text())
        return cls(d["quantiles"], float(d["success_rate"]), d.get("source", ""),
                   float(d.get("rollout_overhead_s", 0.0)), d.get("max_context"), d.get("citations"))


def _cut(first: int, obs: tuple[int, ...], responses: tuple[int, ...],
         max_context: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The trajectory ended at the model's context: the turn that reaches it is cut to fit, and
    it is the last (a prompt that no longer fits ends it before that turn)."""
    first = min(first, max_context - 1)
    context, out = first, []
    for k, r in enumerate(responses):
        room = max_context - context
        if room < 1 or (k and room < 2):
            break
        out.append(min(r, room))
        context += out[-1]
        if k + 1 < len(responses):
            context += obs[k]
            if context >= max_context:
                break
    return first, obs[:max(0, len(out) - 1)], tuple(out)


def fit_from_arrow(parquet_glob: str, steps_glob: str | None = None) -> WorkloadSpec:
    """Fit the distributions from turn rows (the trajectory schema) matched by a glob, and the
    rollout phase's overhead per step from the step metrics (docs/step_metrics_schema.md)
    matched by `steps_glob` (none given: 0)."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"CREATE VIEW turns AS SELECT * FROM read_parquet('{parquet_glob}', hive_partitioning=true)")
    overhead = 0.0
    if steps_glob:
        con.execute(f"CREATE VIEW steps AS SELECT * FROM read_parquet('{steps_glob}', "
                    "hive_partitioning=true, union_by_name=true)")
        overhead = float(con.execute(_ROLLOUT_OVERHEAD).fetchone()[0] or 0.0)
    qs = {}
    for name, sql in _COLUMNS.items():
        vals = np.array([r[0] for r in con.execute(sql).fetchall()], dtype=float)
        if not len(vals):
            raise ValueError(f"no rows for {name} under {parquet_glob}")
        qs[name] = np.quantile(vals, QUANTILES).tolist()
    rate = con.execute("SELECT avg(CAST(r > 0 AS DOUBLE)) FROM (SELECT any_value(trajectory_reward) r "
                       "FROM turns GROUP BY run, trajectory)").fetchone()[0]
    runs = [r[0] for r in con.execute("SELECT DISTINCT run FROM turns ORDER BY run").fetchall()]
    n = con.execute("SELECT count(*) FROM turns").fetchone()[0]
    return WorkloadSpec(qs, float(rate), f"fitted from {n} turns of runs {', '.join(runs)}",
                        overhead)



def fit_data_directory(data_dir: Path, out: Path) -> WorkloadSpec:
    """The workload fitted from the turns (and step metrics) a rose data directory recorded,
    written to `out`, never over a file already there (FileExistsError); FileNotFoundError when
    the directory holds no recorded turns."""
    if not sorted((data_dir / "trajectories").glob("**/*.parquet")):
        raise FileNotFoundError(f"no recorded turns under {data_dir}/trajectories (is it a rose data directory?)")
    steps = data_dir / "metrics" / "steps"
    spec = fit_from_arrow(str(data_dir / "trajectories" / "**" / "*.parquet"),
                          str(steps / "**" / "*.parquet") if list(steps.glob("**/*.parquet")) else None)
    if out.exists():
        raise FileExistsError(f"{out} exists")
    out.write_text(spec.to_json() + "\n")
    return spec

@dataclass(frozen=True, slots=True)
class ServingRequest:
    arrival: float
    prompt: int
    output: int


def serving_arrivals(rate_scale: float, offset_s: float, length_scale: float = 1 / 16,
                     output_scale: float = 1.0, max_model_len: int = 2048,
                     path: Path = DEFAULT_TRACE) -> Iterator[ServingRequest]:
    """The trace from `offset_s` on, wrapping around its hour forever, `rate_scale` times faster,
    lengths scaled like the demo's background replay (prompts x1/16, outputs x1)."""
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    trace = _trace(str(path))
    times, prompts, outputs = _requests(str(path), length_scale, output_scale, max_model_len)
    span = trace.span_s + 1.0
    base, lap = offset_s % span, 0.0
    while True:
        i = int(np.searchsorted(trace.arrival_s, base))
        for t, prompt, output in zip(times[i:], prompts[i:], outputs[i:]):
            yield ServingRequest((lap + t - base) / rate_scale, prompt, output)
        lap += span - base
        base = 0.0


_TRACES: dict = {}
_REQUESTS: dict = {}


def _trace(path: str):
    if path not in _TRACES:  # one parse per process: every serving device reads the same hour
        _TRACES[path] = load_trace(path)
    return _TRACES[path]


def _requests(path: str, length_scale: float, output_scale: float, max_model_len: int):
    """The trace's arrival seconds, prompt and output lengths as scaled, as Python lists: made
    once per process and scaling, not per request and serving GPU."""
    key = (path, length_scale, output_scale, max_model_len)
    if key not in _REQUESTS:
        trace = _trace(path)
        prompts = [min(max(round(int(ctx) * length_scale), 1), max_model_len - 1) for ctx in trace.context_tokens]
        _REQUESTS[key] = ([float(t) for t in trace.arrival_s], prompts,
                          [min(max(round(int(gen) * output_scale), 1), max_model_len - p)
                           for gen, p in zip(trace.generated_tokens, prompts)])
    return _REQUESTS[key]


def trace_requests(max_model_len: int, path: Path = DEFAULT_TRACE) -> tuple[list[int], list[int], float]:
    """The trace's whole prompt and output lengths (clipped to max_model_len) and its span, s."""
    _, prompts, outputs = _requests(str(path), 1.0, 1.0, max_model_len)
    return prompts, outputs, _trace(str(path)).span_s + 1.0


@dataclass(frozen=True)
class StepModel:
    """Train seconds = tokens x train_s_per_token / train GPUs (data parallel, linear: an
    assumption); publish seconds a constant per step (the measured step time left after rollout
    and train). Fitted from bench/results/learning_fidelity.json's fixed-rollout steps."""

    train_s_per_token: float
    publish_s: float
    source: str = ""

    def train_s(self, tokens: int, train_gpus: int) -> float:
        return tokens * self.train_s_per_token / max(1, train_gpus)

    @classmethod
    def from_fidelity(cls, path: str | Path) -> "StepModel":
        d = json.loads(Path(path).read_text())
        steps = [s for seed in d["runs"]["fixed"].values() for s in seed["steps"]]
        per_tok = statistics.median(s["train_s"] / s["tokens"] for s in steps)
        other = statistics.median(max(0.0, s["step_s"] - s["rollout_s"] - s["train_s"]) for s in steps)
        return cls(per_tok, other, f"median over {len(steps)} fixed-rollout steps of {Path(path).name}")


def p90(values: list[int]) -> int:
    xs = sorted(values)
    return xs[min(len(xs) - 1, math.floor(0.9 * len(xs)))] if xs else 0
