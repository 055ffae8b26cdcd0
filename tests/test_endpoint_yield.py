"""Serving first at the door: the endpoint refuses only what serving alone could not serve; a
user that only the rollout's share of the device would have refused makes the rollout yield
(executors/coserving/endpoint/state.py). Fast: a stand-in executor with the real admission."""
from __future__ import annotations

import pytest

from executors.coserving.endpoint.metrics import EndpointMetrics
from executors.coserving.endpoint.protocol import APIError
from executors.coserving.endpoint.state import EndpointState
from executors.policies.latency_profile import Curve, LatencyProfile
from executors.policies.slo_admission import SLOConfig, slo_from_serving_alone

# D(B) = 0.005 + 0.001 (B - 1): at a 20 ms TPOT SLO serving alone decodes 16, at slowdown 2 only 6
PROFILE = LatencyProfile(Curve((16, 1024), (0.002, 0.1)), Curve((16, 1024), (0.002, 0.1)),
                         Curve((1, 64), (0.005, 0.068)))


class StandIn:
    """What the endpoint reads of a co-serving executor: profile, SLO, both slowdowns, whether
    rollout holds the device, and the yield it may ask for."""

    def __init__(self, rollout_slowdown: float, busy: bool) -> None:
        self.serving_profile, self.slo = PROFILE, SLOConfig(ttft_s=0.5, tpot_s=0.02)
        self.serving_slowdown, self.rollout_slowdown = 1.0, rollout_slowdown
        self.busy, self.yields = busy, []

    def rollout_busy(self) -> bool:
        return self.busy

    def yield_to_user(self, prompt_len: int) -> None:
        self.yields.append(prompt_len)


def _state(ex) -> EndpointState:
    return EndpointState(ex, None, "m", 2048, 100, EndpointMetrics())


def _fill(state: EndpointState, n: int) -> None:
    for i in range(n):
        state.admit(f"r{i}", 8)
        state.first_token(f"r{i}")


def test_rollout_yields_to_a_user_the_shared_device_would_refuse():
    ex = StandIn(rollout_slowdown=2.0, busy=True)
    state = _state(ex)
    _fill(state, 10)  # past 6 (the batch at slowdown 2), within 16 (serving alone's)
    assert len(ex.yields) == 4  # the 7th..10th users: rollout yielded, nobody refused
    assert state.in_flight == 10
    assert state.metrics.yielded_to_users._value.get() == 4


def test_without_rollout_on_the_device_nothing_yields_and_serving_alone_decides():
    ex = StandIn(rollout_slowdown=2.0, busy=False)
    state = _state(ex)
    _fill(state, 16)
    assert ex.yields == []
    with pytest.raises(APIError) as e:  # the 17th: serving alone cannot hold its TPOT
        state.admit("r16", 8)
    assert e.value.status == 503 and "decode batch" in str(e.value)


def test_serving_own_slowdown_still_refuses_what_it_cannot_serve():
    ex = StandIn(rollout_slowdown=1.0, busy=True)
    ex.serving_slowdown = 2.0  # serving's own steps are slow: the limit is 6 whatever rollout does
    state = _state(ex)
    _fill(state, 6)
    with pytest.raises(APIError):
        state.admit("r6", 8)
    assert ex.yields == []


def test_a_new_slo_on_the_executor_reaches_the_endpoint():
    ex = StandIn(rollout_slowdown=1.0, busy=False)
    state = _state(ex)
    ex.slo = SLOConfig(ttft_s=0.5, tpot_s=0.01)  # D(B) <= 10 ms: 6 requests
    _fill(state, 6)
    with pytest.raises(APIError):
        state.admit("r6", 8)


def test_run_slo_derived_so_serving_alone_meets_it():
    floor = SLOConfig(ttft_s=0.05, tpot_s=0.02)
    ttft = [0.01 * (1 + i % 10) for i in range(1000)]  # 10..100 ms
    tpot = [0.004] * 990 + [0.03] * 10 + [float("nan")] * 5  # 1% slow; NaN: one-token requests
    slo, how = slo_from_serving_alone(ttft, tpot, floor)
    assert slo.ttft_s == pytest.approx(0.2)  # 2 x P99 (100 ms)
    assert slo.tpot_s == pytest.approx(0.03)  # P99.75 beats 2 x P99 (8 ms) and the floor
    met = sum(a <= slo.ttft_s and (b != b or b <= slo.tpot_s) for a, b in zip(ttft, tpot))
    assert met / len(ttft) >= 0.995
    assert "2 x P99" in how and "P99.75" in how
    quiet, _ = slo_from_serving_alone([0.001] * 50, [0.001] * 50, floor)
    assert quiet == floor  # a quiet machine: the profile's SLO stands
    with pytest.raises(ValueError):
        slo_from_serving_alone(ttft, tpot, floor, attain=1.0)
