"""Dual-SLO admission: run a rollout step only when serving has the slack to absorb it.

Formulas (paper 4.1), with t = now:
  TTFT slack of a queued serving prefill r:  s_r = T_ttft - (t - a_r) - P_m(L_r);  S_ttft = min_r s_r
  TPOT slack of an active serving decode r:  s_r = T_tpot - (t - l_r) - D(B);      S_tpot = min_r s_r
A rollout step of predicted cost c is admitted iff c <= S (S_ttft on prefill instances, S_tpot
on decode instances, min of both where prefill and decode share an instance) and its KV blocks
keep the serving headroom. An empty queue gives +inf slack: nothing to protect.

The TPOT that is measured and promised is a request's mean time per output token, so where a
decode knows its first token's time f_r and its n_r tokens so far, its slack is the budget it
has banked: s_r = T_tpot * n_r - (t - f_r) - D(B) (after the next token, n_r gaps in
t + c + D(B) - f_r seconds must average <= T_tpot). With n_r = 1 this is the gap rule above.
With next_step_prefills, the serving step after the rollout step is priced as vLLM batches it
(D(B), every queued prefill, and an arrival's), in both slacks. The caller holds the P99 cost
of the step, not its mean (executors/policies/prediction_margin.py).
Every method takes `now` so a simulator and the real executor drive the same code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

from executors.policies.latency_profile import LatencyProfile, PrefillMode, PREFILL_MODES
from executors.policies.prediction_margin import nearest_rank

InstanceMode = Literal["prefill", "decode", "mixed"]
INSTANCE_MODES: tuple[str, ...] = ("prefill", "decode", "mixed")
INF = math.inf


@dataclass(frozen=True)
class SLOConfig:
    """Serving SLO budgets in seconds (applied per request, judged at P99)."""

    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"SLO {name} must be a positive number of seconds, got {v!r}")

    @classmethod
    def paper_7b(cls) -> "SLOConfig":
        return cls(ttft_s=0.5, tpot_s=0.15)  # paper: (TPOT, TTFT) = (150 ms, 500 ms), 7B

    @classmethod
    def from_profile(
        cls,
        profile: LatencyProfile,
        prompt_len: int = 2048,
        batch: int = 16,
        ttft_factor: float = 4.0,
        tpot_factor: float = 5.0,
        prefill_mode: PrefillMode = "monolithic",
        min_ttft_s: float = 0.05,
        min_tpot_s: float = 0.02,
    ) -> "SLOConfig":
        """CPU defaults derived from the serving model's own profile (the paper's SLOs are for
        7B/32B models on GPUs and mean nothing for a tiny CPU model).

        Rule: T_ttft = max(min_ttft_s, ttft_factor * P_m(prompt_len)) and
              T_tpot = max(min_tpot_s, tpot_factor * D(batch)),
        i.e. an SLO is a few times what a reference serving request costs on this engine alone,
        which leaves room for rollout steps between serving steps. The factors and the
        reference (2048-token prompt, batch 16) are our choice, not the paper's; the floors keep
        the SLO above the ~10 ms timer and scheduling jitter of a shared CPU box.
        """
        if ttft_factor <= 1 or tpot_factor <= 1:
            raise ValueError("SLO factors must exceed 1, else serving alone breaks its SLO")
        return cls(ttft_s=max(min_ttft_s, ttft_factor * profile.prefill(prompt_len, prefill_mode)),
                   tpot_s=max(min_tpot_s, tpot_factor * profile.decode_step(batch)))


def slo_from_serving_alone(ttft_s: Sequence[float], tpot_s: Sequence[float], floor: SLOConfig,
                           factor: float = 2.0, attain: float = 0.995) -> tuple[SLOConfig, str]:
    """An SLO serving alone meets on this machine, from its own TTFTs and mean TPOTs measured
    over a reference window (NaN: a one-token request, no TPOT): per side
    T = max(floor, factor x P99, Q_q) with q = 1 - (1 - attain) / 2, so each side misses at
    most (1 - attain) / 2 of the requests and both together at most 1 - attain (at least
    `attain` of them meet it). Returns the SLO and its derivation in words."""
    if factor < 1 or not 0 < attain < 1:
        raise ValueError(f"need factor >= 1 and attain in (0, 1), got {factor}, {attain}")
    q = 1 - (1 - attain) / 2
    sides, words = [], []
    for name, xs, low in (("TTFT", ttft_s, floor.ttft_s), ("TPOT", tpot_s, floor.tpot_s)):
        xs = sorted(x for x in xs if math.isfinite(x))
        if not xs:
            sides.append(low)
            words.append(f"{name} {low * 1e3:.0f} ms (the profile's: nothing measured)")
            continue
        p99, pq = nearest_rank(xs, 0.99), nearest_rank(xs, q)
        t = max(low, factor * p99, pq)
        sides.append(t)
        why = ("the profile's floor" if t == low else f"{factor:g} x P99 {p99 * 1e3:.0f} ms"
               if t == factor * p99 else f"P{100 * q:g} {pq * 1e3:.0f} ms")
        words.append(f"{name} {t * 1e3:.0f} ms ({why})")
    return SLOConfig(*sides), (f"max(profile floor, {factor:g} x serving-alone P99, its "
                               f"P{100 * q:g}): " + ", ".join(words))


@dataclass(frozen=True)
class ServingPrefill:
    """A serving request waiting for its prefill: arrival time a_r and prompt length L_r."""

    arrival: float
    prompt_len: int

    def __post_init__(self) -> None:
        if not math.isfinite(self.arrival):
            raise ValueError(f"serving prefill arrival must be finite, got {self.arrival}")
        if self.prompt_len < 1:
            raise ValueError(f"serving prompt_len must be >= 1, got {self.prompt_len}")


@dataclass(frozen=True)
class ServingDecode:
    """A serving request in decode: the time l_r its most recent token came out; where known,
    its first token's time f_r and the tokens n_r it has emitted (the mean-TPOT budget)."""

    last_token_at: float
    first_token_at: float | None = None
    tokens: int = 1

    def __post_init__(self) -> None:
        if not math.isfinite(self.last_token_at):
            raise ValueError(f"serving decode last_token_at must be finite, got {self.last_token_at}")
        if self.tokens < 1:
            raise ValueError(f"serving decode tokens must be >= 1, got {self.tokens}")
        if self.first_token_at is not None and not self.first_token_at <= self.last_token_at:
            raise ValueError("serving decode first_token_at must be finite and <= last_token_at")

    def tpot_budget(self, tpot_s: float, now: float) -> float:
        """Seconds until its next token may come and its mean TPOT still hold the SLO."""
        if self.first_token_at is None or self.tokens == 1:
            return tpot_s - (now - self.last_token_at)
        return tpot_s * self.tokens - (now - self.first_token_at)


@dataclass(frozen=True)
class AdmissionDecision:
    admitted: bool
    slack: float  # the slack the cost was held against (s); +inf when nothing to protect
    reason: str  # "admitted", "kv_headroom", "ttft_slack" or "tpot_slack"
    cost_s: float = 0.0


class DualSLOAdmission:
    """Admission controller for one serving instance.

    mode: "prefill" (a PD-disaggregated prefill instance: TTFT slack only), "decode" (TPOT
    slack only) or "mixed" (prefill and decode on one instance: min of both).
    prefill_mode: the serving engine's prefill mode m used in P_m(L_r).
    """

    def __init__(self, profile: LatencyProfile, slo: SLOConfig, mode: InstanceMode = "mixed",
                 prefill_mode: PrefillMode = "monolithic", arrival_prompt_len: int = 0,
                 next_step_prefills: bool = False) -> None:
        if mode not in INSTANCE_MODES:
            raise ValueError(f"unknown instance mode {mode!r}; expected one of {INSTANCE_MODES}")
        if prefill_mode not in PREFILL_MODES:
            raise ValueError(f"unknown prefill mode {prefill_mode!r}; expected one of {PREFILL_MODES}")
        self.profile, self.slo, self.mode, self.prefill_mode = profile, slo, mode, prefill_mode
        # Beyond the paper (both off by default): a serving request that arrives while a
        # rollout step runs waits for it, so with arrival_prompt_len > 0 the TTFT slack also
        # holds for a request of that length arriving now (without it an empty queue gives +inf
        # and a long rollout chunk can break the next arrival's TTFT at a tight SLO); with
        # next_step_prefills the next serving step's cost in the TPOT slack includes the queued
        # prefills that vLLM batches with the decodes, not just D(B).
        self.arrival_prompt_len, self.next_step_prefills = arrival_prompt_len, next_step_prefills
        # measured / profiled serving step time (the caller tracks it): a profile taken at
        # start-up underestimates every step once the device is contended; 1.0 trusts the profile
        self.slowdown = 1.0
        # the P99 of serving steps' measured / predicted time (>= 1; the caller tracks it): a
        # decode whose banked budget is spent to the edge has nothing left for the next serving
        # step's overrun, so the TPOT slack prices that step at its P99, not its mean
        self.serving_tail = 1.0

    def next_step_s(self, queued: list[ServingPrefill], decodes: int) -> float:
        """The serving step that follows a rollout step, as vLLM batches it (next_step_prefills):
        D(B) for the decodes, every queued prefill, and the prefill of a request that may arrive
        meanwhile (arrival_prompt_len); scaled by the slowdown."""
        m = self.prefill_mode
        step = self.profile.decode_step(decodes) if decodes else 0.0
        step += sum(self.profile.prefill(r.prompt_len, m) for r in queued)
        if self.arrival_prompt_len > 0:
            step += self.profile.prefill(self.arrival_prompt_len, m)
        return self.slowdown * step

    def ttft_slack(self, queued: Iterable[ServingPrefill], now: float,
                   active: Iterable[ServingDecode] = ()) -> float:
        """Seconds a rollout step may take before a queued (or arriving) prefill's first token
        would miss T_ttft. The paper's form charges each prefill its own P_m(L_r); with
        next_step_prefills its first token waits for the whole next serving step."""
        T, m, k = self.slo.ttft_s, self.prefill_mode, self.slowdown
        queued = list(queued)
        if self.next_step_prefills:
            if not queued and self.arrival_prompt_len <= 0:
                return INF
            step = self.next_step_s(queued, len(list(active)))
            oldest = min((r.arrival for r in queued), default=now)
            return T - (now - oldest) - step
        slack = min((T - (now - r.arrival) - k * self.profile.prefill(r.prompt_len, m) for r in queued),
                    default=INF)
        if self.arrival_prompt_len > 0:  # a request arriving now
            slack = min(slack, T - k * self.profile.prefill(self.arrival_prompt_len, m))
        return slack

    def tpot_slack(self, active: Iterable[ServingDecode], now: float,
                   queued: Iterable[ServingPrefill] = ()) -> float:
        """Seconds a rollout step may take before a decode's next token, after the next serving
        step, would take its mean TPOT over T_tpot (ServingDecode.tpot_budget)."""
        active = list(active)
        if not active:
            return INF
        if self.next_step_prefills:
            step = self.next_step_s(list(queued), len(active))
        else:  # D(B): the next serving step is due anyway
            step = self.slowdown * self.profile.decode_step(len(active))
        return min(r.tpot_budget(self.slo.tpot_s, now) for r in active) - self.serving_tail * step

    def admit(self, cost_s: float, queued: Iterable[ServingPrefill],
              active: Iterable[ServingDecode], now: float, kv_ok: bool) -> AdmissionDecision:
        """Decide one rollout step of predicted cost `cost_s` seconds at time `now`."""
        if not (math.isfinite(cost_s) and cost_s >= 0):
            raise ValueError(f"rollout step cost must be finite and >= 0, got {cost_s}")
        queued = list(queued)
        active = list(active)
        s_ttft = self.ttft_slack(queued, now, active) if self.mode != "decode" else INF
        s_tpot = self.tpot_slack(active, now, queued) if self.mode != "prefill" else INF
        slack = min(s_ttft, s_tpot)
        binding = "ttft_slack" if s_ttft <= s_tpot else "tpot_slack"
        if not kv_ok:  # memory first: no slack can pay for eating serving's headroom
            return AdmissionDecision(False, slack, "kv_headroom", cost_s)
        if cost_s > slack:
            return AdmissionDecision(False, slack, binding, cost_s)
        return AdmissionDecision(True, slack, "admitted", cost_s)


def rollout_step_cost(kind: Literal["prefill_chunk", "decode"], tokens_or_batch: int,
                      rollout_profile: LatencyProfile, serving_batch: int | None = None) -> float:
    """Predicted seconds one rollout step holds the device.

    prefill_chunk: P_chunked(c) for a chunk of c <= chunk_size tokens.
    decode: the decode-step increase serving sees. Under temporal sharing (heterogeneous
    models, serving_batch=None) serving waits for the whole rollout step: D_rollout(b). When
    the rollout tokens ride in the serving engine's own batch (one model, serving_batch=B),
    the increase is D(B + b) - D(B).
    """
    if tokens_or_batch < 1:
        raise ValueError(f"rollout step needs >= 1 token or request, got {tokens_or_batch}")
    if kind == "prefill_chunk":
        return rollout_profile.chunk(tokens_or_batch)
    if kind == "decode":
        if serving_batch is None or serving_batch == 0:
            return rollout_profile.decode_step(tokens_or_batch)
        if serving_batch < 0:
            raise ValueError(f"serving_batch must be >= 0, got {serving_batch}")
        return (rollout_profile.decode_step(serving_batch + tokens_or_batch)
                - rollout_profile.decode_step(serving_batch))
    raise ValueError(f"unknown rollout step kind {kind!r}; expected 'prefill_chunk' or 'decode'")
