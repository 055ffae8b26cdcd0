"""The serving half of a co-serving executor: production requests on the serving engine.

Tracks, per request, what dual-SLO admission needs (arrival and prompt length while the
prefill is queued, the last token's time while decoding) and what the caller gets back
(every token's time). Loop thread only, except `validate`.
"""
from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from executors.coserving.serving_window import ServedRequest, ServingLog
from executors.engine.submit import add_tokens
from executors.policies.slo_admission import ServingDecode, ServingPrefill

log = logging.getLogger(__name__)
TokenCallback = Callable[[int, float], None]


@dataclass
class ServingResult:
    request_id: str
    output_ids: list[int]
    arrival: float  # time.monotonic() at submit
    first_token_at: float | None
    token_times: list[float]  # monotonic time each output token came out
    finish_reason: str  # "stop", "length" or "abort"
    prompt_len: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    ttft_s: float = math.nan
    tpot_s: float = math.nan  # mean inter-token time; nan with fewer than 2 tokens

    def __post_init__(self) -> None:
        if self.first_token_at is not None:
            self.ttft_s = self.first_token_at - self.arrival
        if len(self.token_times) >= 2:
            self.tpot_s = (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)


@dataclass(frozen=True)
class ServingSubmission:
    """A serving request on its way from any thread to the owner thread."""
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    temperature: float
    on_token: TokenCallback | None
    future: Future
    arrival: float  # time.monotonic() at submit: TTFT counts the inbox wait too


@dataclass
class _Live:
    fut: Future
    arrival: float
    prompt_len: int
    on_token: TokenCallback | None
    ids: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    cached: int = 0


class ServingSide:
    def __init__(self, engine, scheduler, vocab_size: int, max_model_len: int) -> None:
        self.engine, self.scheduler = engine, scheduler
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.live: dict[str, _Live] = {}
        self.finished = self.tokens = self.steps = 0
        self.step_s = 0.0
        self.callback_errors = 0
        self.log = ServingLog()  # finished requests, for per-step SLO reports

    def validate(self, prompt_ids: list[int], max_tokens: int, temperature: float) -> None:
        """Reject a bad request on the caller's thread (the endpoint turns this into a 4xx)."""
        if not prompt_ids:
            raise ValueError("serving request has an empty prompt")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt_ids):
            raise ValueError(f"serving prompt has token ids outside 0..{self.vocab_size - 1}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) "
                             f"exceeds the model's context of {self.max_model_len}")
        if not (isinstance(temperature, (int, float)) and 0 <= temperature <= 2):
            raise ValueError(f"temperature must be in [0, 2], got {temperature!r}")

    def add(self, sub: ServingSubmission) -> None:
        rid, prompt_ids, fut = sub.request_id, sub.prompt_ids, sub.future
        if rid in self.live:
            fut.set_exception(ValueError(f"serving request id {rid!r} is already in flight"))
            return
        try:
            add_tokens(self.engine, rid, prompt_ids, max_tokens=sub.max_tokens,
                       temperature=sub.temperature, ignore_eos=sub.ignore_eos)
        except Exception as exc:  # whatever vLLM refuses fails this request only
            fut.set_exception(ValueError(f"serving request {rid} rejected: {exc}"))
            return
        self.live[rid] = _Live(fut, sub.arrival, len(prompt_ids), sub.on_token)

    def has_work(self) -> bool:
        return bool(self.live)

    def step(self) -> None:
        t0 = time.perf_counter()
        outputs = self.engine.step()
        now = time.monotonic()
        self.step_s += time.perf_counter() - t0
        self.steps += 1
        for out in outputs:
            r = self.live.get(out.request_id)
            if r is None:
                continue
            completion = out.outputs[0]
            for tok in completion.token_ids:
                r.ids.append(int(tok))
                r.times.append(now)
                self.tokens += 1
                if r.on_token is not None:
                    try:
                        r.on_token(int(tok), now)
                    except Exception:  # a broken stream consumer must not stop the loop
                        self.callback_errors += 1
                        log.exception("on_token callback of %s failed", out.request_id)
                        r.on_token = None
            r.cached = int(out.num_cached_tokens or r.cached)
            if out.finished:
                self._finish(out.request_id, completion.finish_reason or "stop")

    def _finish(self, rid: str, reason: str) -> None:
        r = self.live.pop(rid)
        self.finished += 1
        reason = reason if reason in ("stop", "length") else "abort"
        result = ServingResult(rid, r.ids, r.arrival, r.times[0] if r.times else None,
                               r.times, reason, r.prompt_len, r.cached)
        ttft = result.ttft_s if not math.isnan(result.ttft_s) else math.inf
        self.log.add(ServedRequest(time.monotonic(), ttft, result.tpot_s, len(r.ids),
                                   reason != "abort"))
        r.fut.set_result(result)

    def abort(self, rids: list[str]) -> None:
        rids = [rid for rid in rids if rid in self.live]
        if rids:
            self.engine.abort_request(rids)
            for rid in rids:
                self._finish(rid, "abort")

    # ---- admission inputs ----
    def queued_prefills(self) -> list[ServingPrefill]:
        return [ServingPrefill(r.arrival, r.prompt_len) for r in self.live.values() if not r.times]

    def active_decodes(self) -> list[ServingDecode]:
        return [ServingDecode(r.times[-1], r.times[0], len(r.times)) for r in self.live.values() if r.times]

    def used_blocks(self) -> int:
        return self.scheduler.used_blocks()
