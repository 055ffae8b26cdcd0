"""Admission on the SLO that is measured (a request's mean TPOT), steps sized to the slack, the
margin derived from measured overruns, and the turn start gate (issue: harvest under chat traffic).
Plain Python: the same objects the co-serving executor runs."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from executors.policies.latency_profile import Curve, LatencyProfile
from executors.policies.prediction_margin import PredictionMargin
from executors.policies.slo_admission import DualSLOAdmission, ServingDecode, ServingPrefill, SLOConfig
from executors.policies.step_plan import StepPlan, smaller_steps
from executors.policies.turn_start import TurnStartGate

# serving: P(L) = 1e-4 * L s, D(B) = 0.005 + 0.001 * (B - 1) s
SERVING = LatencyProfile(Curve((16, 1024), (0.0016, 0.1024)), Curve((16, 1024), (0.0016, 0.1024)),
                         Curve((1, 17), (0.005, 0.021)))
# rollout: D(b) = 0.004 + 0.0005 * (b - 1); chunk(c) = 0.002 + 5e-5 * c
ROLLOUT = LatencyProfile(Curve((32, 512), (0.0036, 0.0276)), Curve((32, 512), (0.0036, 0.0276)),
                         Curve((1, 33), (0.004, 0.020)), chunk_size=512)


def test_mean_tpot_budget_spends_what_a_fast_decode_banked():
    # 11 tokens so far at 7 ms each under a 17 ms SLO: 10 gaps x 10 ms = 100 ms banked
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.017)
    first, now = 10.0, 10.0 + 10 * 0.007
    banked = ServingDecode(last_token_at=now, first_token_at=first, tokens=11)
    gap_only = ServingDecode(last_token_at=now)  # the per-gap rule: 17 ms - D(1) is all there is
    adm = DualSLOAdmission(SERVING, slo, "decode")
    assert adm.tpot_slack([gap_only], now) == pytest.approx(0.017 - 0.005)
    assert adm.tpot_slack([banked], now) == pytest.approx(0.017 * 11 - 0.07 - 0.005)
    assert not adm.admit(0.05, [], [gap_only], now, True).admitted
    assert adm.admit(0.05, [], [banked], now, True).admitted
    # a request already over its mean has no budget, however many tokens it has
    late = ServingDecode(last_token_at=now, first_token_at=now - 10 * 0.02, tokens=11)
    assert adm.tpot_slack([late], now) < 0


def test_serving_decode_rejects_inconsistent_times():
    with pytest.raises(ValueError, match="tokens"):
        ServingDecode(1.0, 0.5, tokens=0)
    with pytest.raises(ValueError, match="first_token_at"):
        ServingDecode(1.0, 2.0, tokens=3)


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.floats(0.0, 0.3), min_size=1, max_size=12),
       prompts=st.lists(st.integers(16, 256), min_size=12, max_size=12),
       outputs=st.lists(st.integers(1, 60), min_size=12, max_size=12),
       costs=st.lists(st.floats(0.0005, 0.4), min_size=1, max_size=12))
def test_no_admitted_step_takes_a_request_over_its_slo(gaps, prompts, outputs, costs):
    """Serving alone meets the SLO on this device (step times exactly the profile's); for any
    arrival pattern drawn (at most one arrival per TTFT window, prompts up to the protected
    arrival length) and any rollout steps offered, no request's TTFT or mean TPOT goes over."""
    max_len = 256
    max_step = SERVING.decode_step(12) + 2 * SERVING.prefill(max_len)
    slo = SLOConfig(ttft_s=2 * max_step + 0.01, tpot_s=max_step + 0.002)
    adm = DualSLOAdmission(SERVING, slo, "mixed", arrival_prompt_len=max_len, next_step_prefills=True)
    at, arrivals = 0.0, []
    for g in gaps:
        at += slo.ttft_s + g
        arrivals.append(at)
    pending = list(zip(arrivals, prompts, outputs))
    queued, active, done = [], [], []  # active: [arrival, first, last, tokens, want]
    t, ran = 0.0, 0
    while pending or queued or active:
        while pending and pending[0][0] <= t:
            a, L, n = pending.pop(0)
            queued.append((a, L, n))
        if queued or active:  # one serving step: every queued prefill and every decode
            t += (SERVING.decode_step(len(active)) if active else 0.0) + \
                sum(SERVING.prefill(L) for _, L, _ in queued)
            for r in active:
                r[2], r[3] = t, r[3] + 1
            active += [[a, t, t, 1, n] for a, _, n in queued]
            queued = []
            done += [r for r in active if r[3] >= r[4]]
            active = [r for r in active if r[3] < r[4]]
        # as the executor does: the largest offered step that fits the slack runs
        view = ([ServingPrefill(a, L) for a, L, _ in queued],
                [ServingDecode(r[2], r[1], r[3]) for r in active])
        cost = next((c for c in sorted(costs, reverse=True) if adm.admit(c, *view, t, True).admitted), None)
        if cost is not None:
            t += cost
            ran += 1
        elif not (queued or active):
            t = pending[0][0] if pending else t
    for a, first, last, tokens, _ in done:
        assert first - a <= slo.ttft_s + 1e-9
        if tokens > 1:
            assert (last - first) / (tokens - 1) <= slo.tpot_s + 1e-9
    assert ran > 0 or min(costs) > slo.ttft_s / 2  # the device was lent, not just left idle


def test_smaller_steps_halve_down_to_the_efficiency_floor():
    full = StepPlan("decode", 32, ROLLOUT.decode_step(32), 2)
    sizes = [p.tokens for p in smaller_steps(full, ROLLOUT, 512)]
    assert sizes == [16, 8]  # 4 tokens in 5.5 ms is under half of 32 in 19.5 ms: wait instead
    assert all(p.cost_s < full.cost_s and p.blocks == 2 for p in smaller_steps(full, ROLLOUT, 512))
    flat = LatencyProfile(ROLLOUT.monolithic, ROLLOUT.chunked, Curve((1, 33), (0.010, 0.0101)))
    # a flat curve (fixed cost per step): half the batch keeps half the rate, a quarter does not
    assert [p.tokens for p in smaller_steps(StepPlan("decode", 32, flat.decode_step(32), 0), flat, 512)] == [16]
    assert smaller_steps(StepPlan("preempt", 32, 0.02, 0), ROLLOUT, 512) == []
    # no floor (serving idle: waiting does not raise the slack): every halving down to one
    assert [p.tokens for p in smaller_steps(full, ROLLOUT, 512, floor=0.0)] == [16, 8, 4, 2, 1]
    chunk = StepPlan("prefill_chunk", 512, ROLLOUT.chunk(512), 17)
    assert [p.tokens for p in smaller_steps(chunk, ROLLOUT, 512)][:2] == [256, 128]


def test_prediction_margin_is_a_high_quantile_of_overrun_ratios():
    m = PredictionMargin(quantile=0.9, min_samples=10)
    for i in range(9):
        m.observe(0.010, 0.012)
    assert m.factor() == 1.0  # too few to judge: the prediction as it is
    m.observe(0.010, 0.008)  # faster than predicted
    assert m.factor() == pytest.approx(1.2)
    for _ in range(2):
        m.observe(0.020, 0.060)  # two steps 3x their prediction in 12: above the 90th percentile's rank
    assert m.factor() == pytest.approx(3.0)
    fast = PredictionMargin(min_samples=1)
    fast.observe(0.010, 0.005)
    assert fast.factor() == 1.0  # never below the prediction
    serving = PredictionMargin(quantile=0.9, min_samples=10)
    for _ in range(12):
        serving.observe(0.010, 0.020)  # serving steps run 2x too: noise both see
    assert m.factor(serving) == pytest.approx(1.5)  # only rollout's tail beyond it
    assert m.factor(PredictionMargin()) == 1.0  # no serving steps yet to compare with
    with pytest.raises(ValueError):
        m.observe(math.nan, 0.01)
    with pytest.raises(ValueError):
        m.observe(0.0, 0.01)
    with pytest.raises(ValueError):
        PredictionMargin(quantile=1.0)


def test_turn_start_gate_hands_back_while_serving_leaves_no_slack_and_recovers():
    g = TurnStartGate(stall_timeout_s=2.0)
    assert g.should_start(0.0, 0.5)  # no history: only running says
    t = 0.0
    for _ in range(100):  # open 10% of the time, in short closed runs
        g.observe(t, True)
        t += 0.01
        g.observe(t, False)
        t += 0.09
    assert g.open_share(t) == pytest.approx(0.1, abs=0.02)
    assert g.predicted_s(t, 0.5) == pytest.approx(5.0, rel=0.2)
    assert not g.should_start(t, 0.5)  # 5 s > max(stall 2 s, 2 x 0.5 s)
    assert g.should_start(t, 0.05)  # a short turn still fits at 10%
    for _ in range(300):  # a long closed run: anything started now would stall
        g.observe(t, False)
        t += 0.01
    assert g.longest_closed_s(t) >= 2.0 and not g.should_start(t, 0.01)
    for _ in range(500):  # serving's burst is over: open again
        g.observe(t, True)
        t += 0.01
    assert g.should_start(t, 0.5)
    with pytest.raises(ValueError):
        TurnStartGate(0.0)


def test_turn_start_gate_forgets_the_time_its_engine_was_down():
    g = TurnStartGate(stall_timeout_s=2.0)
    g.observe(0.0, False)  # serving was busy when the engine was parked ...
    assert not g.should_start(60.0, 0.1)  # ... so, remembered, the park reads as a 60 s closed run
    g.forget()  # woken: a new engine, no history
    assert g.open_share(60.0) is None and g.longest_closed_s(60.0) == 0.0
    assert g.should_start(60.0, 0.1)
