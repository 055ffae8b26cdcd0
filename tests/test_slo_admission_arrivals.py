"""The admission options beyond the paper, by hand (profiles of tests/test_slo_admission.py):
a serving request arriving during the rollout step, the queued prefills in the next serving
step's cost, and the measured slowdown of the device."""
import math

import pytest

from executors.policies.slo_admission import DualSLOAdmission, ServingDecode, ServingPrefill
from test_slo_admission import NOW, SERVING, SLO


def test_arrival_reserve_bounds_an_empty_queue():
    adm = DualSLOAdmission(SERVING, SLO, "mixed")
    assert adm.ttft_slack([], NOW) == math.inf  # the paper: nothing queued, nothing to protect
    adm.arrival_prompt_len = 500  # P_mono(500) = 0.05: a 500-token request arriving now
    assert adm.ttft_slack([], NOW) == pytest.approx(0.45)
    assert not adm.admit(0.46, [], [], NOW, kv_ok=True).admitted
    assert adm.admit(0.44, [], [], NOW, kv_ok=True).admitted


def test_next_step_counts_queued_prefills_in_tpot_slack():
    active, queued = [ServingDecode(NOW)], [ServingPrefill(NOW, 200)]
    plain = DualSLOAdmission(SERVING, SLO, "decode")
    assert plain.tpot_slack(active, NOW, queued) == pytest.approx(0.15 - 0.01)  # D(1) only
    batched = DualSLOAdmission(SERVING, SLO, "decode", next_step_prefills=True)
    assert batched.tpot_slack(active, NOW, queued) == pytest.approx(0.15 - 0.01 - 0.02)  # + P(200)


def test_slowdown_scales_the_serving_predictions():
    adm = DualSLOAdmission(SERVING, SLO, "decode")
    adm.slowdown = 2.0
    assert adm.tpot_slack([ServingDecode(NOW)], NOW) == pytest.approx(0.15 - 0.02)


def test_tpot_slack_prices_the_next_serving_step_at_its_tail():
    """A decode whose banked budget is spent to the edge needs room for the next serving step's
    overrun: with serving steps' P99 at 2x their prediction, the step counts twice; TTFT not."""
    adm = DualSLOAdmission(SERVING, SLO, "mixed")
    active, queued = [ServingDecode(NOW)], [ServingPrefill(NOW, 200)]
    mean_tpot, ttft = adm.tpot_slack(active, NOW), adm.ttft_slack(queued, NOW)
    adm.serving_tail = 2.0
    assert adm.tpot_slack(active, NOW) == pytest.approx(mean_tpot - 0.01)  # D(1) once more
    assert adm.ttft_slack(queued, NOW) == pytest.approx(ttft)
