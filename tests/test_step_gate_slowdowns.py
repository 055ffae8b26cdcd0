"""The co-serving executor's step gate keeps two slowdowns, one per engine: serving steps' prices
the serving predictions admission makes (the next serving step, an arrival's prefill), rollout
steps' prices the rollout step held against the slack. One for both let a rollout profile that
was 2x off price serving steps 3x too dear (measured in the chat load: no rollout step ran).
And the turn-start gate counts an iteration where a rollout step ran as open, though the step
spent the slack it found. Fast: StepGate on a stand-in executor's fields, the real policies."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from executors.coserving.step_gate import StepGate
from executors.policies.latency_profile import Curve, LatencyProfile
from executors.policies.prediction_margin import PredictionMargin
from executors.policies.slo_admission import SLOConfig
from executors.policies.step_plan import StepPlan
from executors.policies.turn_start import TurnStartGate

PROFILE = LatencyProfile(Curve((16, 1024), (0.002, 0.1)), Curve((16, 1024), (0.002, 0.1)),
                         Curve((1, 64), (0.005, 0.068)))


class Gate(StepGate):
    def __init__(self) -> None:
        self.serving_profile = self.rollout_profile = PROFILE
        self.slo = SLOConfig(ttft_s=0.5, tpot_s=0.05)
        self.wiring = SimpleNamespace(admission=True)
        self.serving_slowdown = self.rollout_slowdown = 1.0
        self.margin, self.serving_margin = PredictionMargin(), PredictionMargin()
        self.recent_prompts, self.yield_until = [], -1.0
        self.turn_gate, self.rollout = TurnStartGate(1.0), object()
        self.admission = self.new_admission()


def test_each_engine_keeps_its_own_slowdown():
    g = Gate()
    plan = StepPlan("decode", 4, 0.010, 0)
    for _ in range(100):
        g.observe_step(plan, 0.020)  # rollout steps run 2x their profile
        g.observe_serving_step(0.010, 0.007)  # serving steps 0.7x theirs
    assert g.rollout_slowdown == pytest.approx(2.0, rel=1e-3)
    assert g.serving_slowdown == pytest.approx(0.7, rel=1e-3)
    assert g.admission.slowdown == g.serving_slowdown  # admission prices serving steps with it
    g.margin, g.serving_margin = PredictionMargin(), PredictionMargin()  # no tail margin: slowdown alone
    assert g.p99_cost(0.010) == pytest.approx(0.020, rel=1e-3)  # rollout costs with rollout's
    assert g.new_admission().slowdown == g.serving_slowdown  # a new SLO keeps it


def test_a_freak_step_moves_a_slowdown_only_so_far():
    g = Gate()
    g.observe_serving_step(0.001, 10.0)  # a page fault: 10,000x
    assert g.serving_slowdown == pytest.approx(0.9 + 0.1 * 8.0)


def test_turn_gate_counts_an_iteration_that_ran_a_rollout_step_as_open():
    g = Gate()
    for i in range(10):  # after each step no slack is left, yet rollout ran every iteration
        g._observe_turn_gate(0.1 * i, slack=-1.0, ran=True)
    assert g.turn_gate.open_share(1.0) == pytest.approx(1.0)
    h = Gate()
    for i in range(10):
        h._observe_turn_gate(0.1 * i, slack=-1.0, ran=False)
    assert h.turn_gate.open_share(1.0) == pytest.approx(0.0)
