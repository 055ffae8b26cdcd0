"""Thin adapter over an in-process vLLM engine, owned by one thread (executors/engine/owner.py,
the same owner as the co-serving executor's two engines).

Callers on any thread submit turns and block on futures; the owner thread builds and steps
the engine (vLLM's LLMEngine is not thread-safe), so concurrent Dask tasks on a worker share
one continuously batched engine.
"""
from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from executors.engine.device import DeviceSpec, apply_env, engine_setup
from executors.engine.owner import EngineOwner, futures_of
from executors.turns import TurnRequest, TurnResult

@dataclass
class EngineSpec:
    model_dir: Path
    max_model_len: int = 2048
    max_num_seqs: int = 128
    seed: int = 0
    enable_prefix_caching: bool = True
    dtype: str = "bfloat16"
    block_size: int = 32  # CPU attention needs multiples of 32; small blocks let prefixes hit

    def __post_init__(self) -> None:
        self.model_dir = Path(self.model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"model directory {self.model_dir} has no config.json "
                                    "(build it with `rose models build`)")


def build_engine(spec: EngineSpec, device: DeviceSpec | None = None):
    """A rollout worker's one engine on this worker's device (DeviceSpec.from_env())."""
    kwargs, env = engine_setup("dedicated", device or DeviceSpec.from_env(),
                               model_dir=spec.model_dir, max_model_len=spec.max_model_len,
                               max_num_seqs=spec.max_num_seqs, seed=spec.seed,
                               block_size=spec.block_size, dtype=spec.dtype,
                               prefix_caching=spec.enable_prefix_caching)
    apply_env(env)
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    return LLMEngine.from_engine_args(EngineArgs(**kwargs))


class EngineLoop(EngineOwner):
    """Owns one vLLM engine on its owner thread (executors/engine/owner.py: built, stepped and
    reloaded there); `submit` is thread-safe and returns a Future[TurnResult]."""

    def __init__(self, spec: EngineSpec, worker: str, worker_kind: str) -> None:
        self.spec, self.worker, self.worker_kind = spec, worker, worker_kind
        self.policy_version = 0
        self.run = ""  # the run whose weights it holds ("": the checkpoint it was built from)
        self._live: dict[str, tuple[TurnRequest, Future, float]] = {}
        self.failure: BaseException | None = None  # set when the engine itself broke
        self.last_progress = time.monotonic()
        self._start(f"engine-{worker}")  # builds the engine on the owner thread

    # ---- public API (any thread) ----
    def submit(self, request: TurnRequest) -> Future:
        fut: Future = Future()
        if self.failure is not None:
            fut.set_exception(RuntimeError(f"engine on {self.worker} is down: {self.failure!r}"))
            return fut
        self._post(("submit", request, fut))
        return fut

    def generate(self, requests: Iterable[TurnRequest]) -> list[TurnResult]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def abort(self, request_ids: Iterable[str]) -> None:
        self._post(("abort", list(request_ids)))

    def call(self, fn) -> object:
        """Run fn(engine) on the owner thread between steps (weight reloads, cache resets)."""
        if self.failure is not None:
            raise RuntimeError(f"engine on {self.worker} is down: {self.failure!r}")
        return self._call(lambda: fn(self.engine))

    def reload(self, tensors: dict[str, torch.Tensor], version: int, run: str = "") -> int:
        """Load `version` of `run` in place on the owner thread; returns how many turns were
        resubmitted (a turn of another run than `run` is answered "stale" instead).

        No turn may mix KV of two policy versions, and vLLM's reset_prefix_cache() refuses while
        requests run. Of the three ways out (wait for in-flight turns to finish, reload only
        between turns, abort and resubmit) we abort and resubmit: the reload lands at once, so
        a long turn never delays a publish (no added staleness) and no wait can stall on a
        turn that does not end; the price is recomputing the partial turns, which on this
        loop is a few tokens per turn (reloads come once per RL step). Each resubmitted turn
        runs whole on the new version from its prompt (same id, same seed) and is recorded
        with that version; its caller only sees a longer turn.
        """
        def swap(engine) -> int:
            live = list(self._live.items())
            if live:
                engine.abort_request([rid for rid, _ in live])
                self._live.clear()
            reload_weights(engine, tensors)  # no request left: the prefix cache is dropped
            self.policy_version, self.run = version, run or self.run
            for _, (request, fut, _) in live:
                self._add(request, fut)
            return len(live)
        return self.call(swap)

    def num_inflight(self) -> int:
        with self._cv:
            return len(self._live) + sum(item[0] == "submit" for item in self._inbox)

    # ---- owner thread ----
    def _open(self) -> None:
        self.engine = build_engine(self.spec)

    def _iterate(self, inbox: list[tuple]) -> None:
        for item in inbox:
            if item[0] == "call":
                self._run_call(item)
            elif item[0] == "submit":
                self._add(item[1], item[2])
            elif item[0] == "abort":
                live_aborts = [rid for rid in item[1] if rid in self._live]
                if live_aborts:
                    self.engine.abort_request(live_aborts)
                    for rid in live_aborts:
                        request, fut, _ = self._live.pop(rid)
                        fut.set_result(self._empty(request, "abort"))
        if self._live:
            for out in self.engine.step():
                self.last_progress = time.monotonic()
                if out.finished and out.request_id in self._live:
                    request, fut, _ = self._live.pop(out.request_id)
                    fut.set_result(self._result(request, out))
        self._busy = bool(self._live)  # turns running: step again without sleeping

    def _idle_wait(self) -> float:
        return 1.0  # nothing live: posts wake the owner at once anyway

    def _on_failure(self, exc: Exception) -> None:
        """The engine itself broke: every waiting turn fails with the error (the scheduler
        reroutes them) and the owner stops, instead of hanging callers on a dead engine."""
        self.failure = exc
        waiting = [f for _, f, _ in self._live.values()]
        waiting += [f for item in self._drain() for f in futures_of(item)]
        self._live.clear()
        self._running = False
        for fut in waiting:
            if not fut.done():
                fut.set_exception(RuntimeError(f"engine on {self.worker} failed: {exc!r}"))

    def _add(self, request: TurnRequest, fut: Future) -> None:
        from vllm import SamplingParams, TokensPrompt

        if request.min_policy_version > self.policy_version or not request.runs_on(self.run):
            fut.set_result(self._empty(request, "stale"))
            return
        params = SamplingParams(max_tokens=request.max_tokens,
                                temperature=request.temperature, top_p=request.top_p,
                                seed=request.seed, logprobs=0, detokenize=False,
                                stop_token_ids=request.stop_token_ids or None)
        try:
            self.engine.add_request(request.request_id,
                                    TokensPrompt(prompt_token_ids=request.prompt_ids), params)
        except Exception as exc:  # e.g. prompt longer than max_model_len
            fut.set_exception(ValueError(f"turn {request.request_id} rejected: {exc}"))
            return
        self._live[request.request_id] = (request, fut, time.monotonic())

    def _empty(self, request: TurnRequest, reason: str) -> TurnResult:
        return TurnResult(request.request_id, request.trajectory_id, [], [], reason,
                          self.worker, self.worker_kind, self.policy_version,
                          len(request.prompt_ids))

    def _result(self, request: TurnRequest, out) -> TurnResult:
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [float(step[tok].logprob) for step, tok in zip(completion.logprobs or [], ids)]
        stats = getattr(out, "metrics", None)
        queued = prefill = decode = 0.0
        if stats is not None and getattr(stats, "first_token_ts", 0):
            queued = max(0.0, stats.scheduled_ts - stats.queued_ts)
            prefill = max(0.0, stats.first_token_ts - stats.scheduled_ts)
            decode = max(0.0, stats.last_token_ts - stats.first_token_ts)
        # an engine-side abort keeps its own status: the scheduler reroutes it, never trains on it
        reason = completion.finish_reason if completion.finish_reason in ("stop", "abort") else "length"
        return TurnResult(request.request_id, request.trajectory_id, ids, logprobs, reason,
                          self.worker, self.worker_kind, self.policy_version,
                          len(request.prompt_ids), int(out.num_cached_tokens or 0),
                          queued, prefill, decode)


def reload_weights(engine, tensors: dict[str, torch.Tensor]) -> None:
    """In-place reload (no restart), then drop the prefix cache: its KV came from old weights.

    The engine must hold no request (vLLM refuses to reset a prefix cache that running
    requests use, and a turn would mix KV of two versions): callers abort them first
    (EngineLoop.reload, the co-serving executor's rollout reload). RuntimeError otherwise."""
    engine.collective_rpc("reload_weights", kwargs={"weights_iterator": list(tensors.items())})
    engine.collective_rpc(_repack_output_heads)
    if engine.reset_prefix_cache() is False:
        raise RuntimeError("weights reloaded but vLLM kept its prefix cache: requests were "
                           "still running (abort them before a reload)")


def _repack_output_heads(worker_self) -> int:
    """vLLM CPU packs the LM head into a GEMM-ready copy at load; with tied embeddings the head
    gets no weights of its own during a reload, so that copy keeps the OLD embeddings and
    sampling silently runs a stale head. Re-pack every embedding-shaped head (no-op on GPU)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    repacked = 0
    for module in worker_self.model_runner.model.modules():
        if (isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear")
                and module.weight.numel() > 0):
            module.quant_method.process_weights_after_loading(module)
            repacked += 1
    return repacked


def read_weight(engine, name: str) -> torch.Tensor:
    """A parameter as the engine holds it (only un-repacked ones, e.g. embeddings and norms)."""
    def _get(worker_self):
        params = dict(worker_self.model_runner.model.named_parameters())
        return params[name].detach().clone()
    return engine.collective_rpc(_get)[0]
