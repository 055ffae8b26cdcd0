"""Admit one serving request at the HTTP endpoint, or refuse it at once (503 + Retry-After).

The endpoint admits a request only while the engine can still serve it within the SLO, as the
serving profile predicts it (paper 4.1's curves, executors/policies/latency_profile.py):
  TTFT:  k * P_m(W + L) <= T_ttft   W: prompt tokens admitted and still waiting for their first
                                    token, L: this request's prompt. vLLM prefills the waiting
                                    prompts together in the next steps, so the new request's
                                    first token comes after all W and its own L are prefilled.
  TPOT:  B + 1 <= max_batch and k * D(B + 1) <= T_tpot
                                    B: requests admitted and not finished. Beyond the engine's
                                    largest decode batch (max_num_seqs, the profile's largest
                                    measured batch) a request is not decoding but queued behind
                                    whole requests, a wait the profile cannot bound.
  memory: B < hard_cap              whatever the profile says (a flood of tiny prompts).
k is the device's measured slowdown against its profile (the co-serving executor's EWMA of
measured / profiled step time): the profile is taken on a quiet machine, so its raw
predictions are optimistic by exactly that ratio once the device is shared.
A request alone (nothing waiting) is admitted whatever its own prefill costs: refusing it
cannot make it faster, and its Retry-After would refuse it again forever.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from executors.policies.latency_profile import PREFILL_MODES, LatencyProfile, PrefillMode
from executors.policies.slo_admission import SLOConfig


@dataclass(frozen=True)
class EndpointDecision:
    admitted: bool
    reason: str  # "admitted", "hard_cap", "decode_batch" or "ttft"
    predicted_ttft_s: float  # k * P_m(W + L), the TTFT the profile predicts for this request


class EndpointAdmission:
    """Admission at one serving endpoint from its engine's serving profile and SLO."""

    def __init__(self, profile: LatencyProfile, slo: SLOConfig, hard_cap: int,
                 max_batch: int | None = None, prefill_mode: PrefillMode = "monolithic") -> None:
        if prefill_mode not in PREFILL_MODES:
            raise ValueError(f"unknown prefill mode {prefill_mode!r}; expected one of {PREFILL_MODES}")
        largest = int(profile.decode.xs[-1])  # beyond it D(B) is an extrapolation
        self.max_batch = largest if max_batch is None else int(max_batch)
        if hard_cap < 1 or self.max_batch < 1:
            raise ValueError(f"hard_cap and max_batch must be >= 1, got {hard_cap}, {self.max_batch}")
        self.profile, self.slo, self.hard_cap, self.prefill_mode = profile, slo, hard_cap, prefill_mode

    def predicted_ttft(self, waiting_tokens: int, prompt_len: int, slowdown: float = 1.0) -> float:
        """k * P_m(W + L): seconds until this request's first token, prefill only."""
        return slowdown * self.profile.prefill(waiting_tokens + prompt_len, self.prefill_mode)

    def batch_limit(self, slowdown: float = 1.0) -> int:
        """The largest decode batch B <= max_batch with k * D(B) <= T_tpot (at least 1: one
        request alone is served however slow the device)."""
        lo, hi = 1, self.max_batch  # D is monotone (Curve lifts dips): bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if slowdown * self.profile.decode_step(mid) <= self.slo.tpot_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def decide(self, prompt_len: int, waiting_tokens: int, in_flight: int,
               slowdown: float = 1.0) -> EndpointDecision:
        """Admit a request of `prompt_len` tokens with `waiting_tokens` admitted prompt tokens
        still before their first token and `in_flight` requests admitted and not finished."""
        if prompt_len < 1 or waiting_tokens < 0 or in_flight < 0:
            raise ValueError(f"need prompt_len >= 1 and counts >= 0, got {prompt_len}, "
                             f"{waiting_tokens}, {in_flight}")
        if not (math.isfinite(slowdown) and slowdown > 0):
            raise ValueError(f"slowdown must be a positive number, got {slowdown}")
        ttft = self.predicted_ttft(waiting_tokens, prompt_len, slowdown)
        if in_flight >= self.hard_cap:
            return EndpointDecision(False, "hard_cap", ttft)
        if in_flight + 1 > self.batch_limit(slowdown):
            return EndpointDecision(False, "decode_batch", ttft)
        if waiting_tokens > 0 and ttft > self.slo.ttft_s:
            return EndpointDecision(False, "ttft", ttft)
        return EndpointDecision(True, "admitted", ttft)
