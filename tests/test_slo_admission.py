import math

import pytest

from executors.policies.latency_profile import Curve, LatencyProfile
from executors.policies.slo_admission import (
    DualSLOAdmission, ServingDecode, ServingPrefill, SLOConfig, rollout_step_cost,
)

# serving: P_mono(L) = 1e-4 * L (100..1000 tokens, same slope beyond), P_chunked(L) = 1.2e-4 * L,
# D(B) = 0.01 + 0.005 * (B - 1)
SERVING = LatencyProfile(Curve((100, 1000), (0.01, 0.1)), Curve((100, 1000), (0.012, 0.12)),
                         Curve((1, 9), (0.01, 0.05)))
# rollout: P_chunked(c) 0.02 s at 128 -> 0.05 s at 512; D(b) = 0.006 + 0.001 * (b - 1)
ROLLOUT = LatencyProfile(Curve((128, 512), (0.015, 0.04)), Curve((128, 512), (0.02, 0.05)),
                         Curve((1, 16), (0.006, 0.021)))
SLO = SLOConfig(ttft_s=0.5, tpot_s=0.15)
NOW = 0.3
QUEUED = [ServingPrefill(arrival=0.0, prompt_len=1000), ServingPrefill(arrival=0.2, prompt_len=200)]
ACTIVE = [ServingDecode(0.25), ServingDecode(0.28), ServingDecode(0.29)]


def test_ttft_slack_is_min_over_queued_prefills_by_hand():
    adm = DualSLOAdmission(SERVING, SLO, "prefill")
    # r1: 0.5 - 0.3 - 0.1 = 0.1 ; r2: 0.5 - 0.1 - 0.02 = 0.38
    assert adm.ttft_slack(QUEUED, NOW) == pytest.approx(0.1)
    assert adm.ttft_slack(QUEUED[1:], NOW) == pytest.approx(0.38)
    chunked = DualSLOAdmission(SERVING, SLO, "prefill", prefill_mode="chunked")
    # r1: 0.5 - 0.3 - 0.12 = 0.08 ; r2: 0.5 - 0.1 - 0.024 = 0.376
    assert chunked.ttft_slack(QUEUED, NOW) == pytest.approx(0.08)


def test_tpot_slack_uses_batch_size_of_active_decodes_by_hand():
    adm = DualSLOAdmission(SERVING, SLO, "decode")
    # B = 3: D(3) = 0.02 ; slacks 0.15-0.05-0.02=0.08, 0.15-0.02-0.02=0.11, 0.15-0.01-0.02=0.12
    assert adm.tpot_slack(ACTIVE, NOW) == pytest.approx(0.08)
    # B = 1: D(1) = 0.01 ; 0.15 - 0.01 - 0.01
    assert adm.tpot_slack(ACTIVE[2:], NOW) == pytest.approx(0.13)


def test_empty_queues_give_infinite_slack_and_admit_anything():
    adm = DualSLOAdmission(SERVING, SLO, "mixed")
    assert adm.ttft_slack([], NOW) == math.inf
    assert adm.tpot_slack([], NOW) == math.inf
    d = adm.admit(5.0, [], [], NOW, kv_ok=True)
    assert d.admitted and d.slack == math.inf and d.reason == "admitted"


@pytest.mark.parametrize("mode, slack", [("prefill", 0.1), ("decode", 0.08), ("mixed", 0.08)])
def test_mode_picks_which_slack_binds(mode, slack):
    adm = DualSLOAdmission(SERVING, SLO, mode)
    ok = adm.admit(slack - 0.001, QUEUED, ACTIVE, NOW, kv_ok=True)
    assert ok.admitted and ok.slack == pytest.approx(slack)
    no = adm.admit(slack + 0.001, QUEUED, ACTIVE, NOW, kv_ok=True)
    assert not no.admitted and no.slack == pytest.approx(slack)
    assert no.reason == ("ttft_slack" if mode == "prefill" else "tpot_slack")


def test_mixed_mode_reports_ttft_when_ttft_binds():
    adm = DualSLOAdmission(SERVING, SLO, "mixed")
    relaxed = [ServingDecode(NOW)]  # slack 0.15 - 0 - 0.01 = 0.14 > ttft 0.1
    d = adm.admit(0.12, QUEUED, relaxed, NOW, kv_ok=True)
    assert not d.admitted and d.reason == "ttft_slack" and d.slack == pytest.approx(0.1)


def test_prefill_instance_ignores_decodes_and_decode_instance_ignores_prefills():
    late = [ServingDecode(NOW - 1.0)]  # overdue: tpot slack negative
    assert DualSLOAdmission(SERVING, SLO, "prefill").admit(0.05, QUEUED, late, NOW, True).admitted
    overdue = [ServingPrefill(arrival=NOW - 2.0, prompt_len=100)]
    assert DualSLOAdmission(SERVING, SLO, "decode").admit(0.05, overdue, ACTIVE, NOW, True).admitted
    assert not DualSLOAdmission(SERVING, SLO, "mixed").admit(0.0, overdue, ACTIVE, NOW, True).admitted


def test_negative_slack_refuses_even_a_free_step():
    adm = DualSLOAdmission(SERVING, SLO, "decode")
    d = adm.admit(0.0, [], [ServingDecode(NOW - 0.2)], NOW, kv_ok=True)
    assert not d.admitted and d.slack == pytest.approx(0.15 - 0.2 - 0.01)


def test_kv_veto_wins_over_slack():
    adm = DualSLOAdmission(SERVING, SLO, "mixed")
    d = adm.admit(0.0, [], [], NOW, kv_ok=False)
    assert not d.admitted and d.reason == "kv_headroom"


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="instance mode"):
        DualSLOAdmission(SERVING, SLO, "both")
    with pytest.raises(ValueError, match="cost"):
        DualSLOAdmission(SERVING, SLO).admit(-0.1, [], [], NOW, True)
    with pytest.raises(ValueError, match="ttft_s"):
        SLOConfig(ttft_s=0, tpot_s=0.1)
    with pytest.raises(ValueError, match="prompt_len"):
        ServingPrefill(arrival=0.0, prompt_len=0)


def test_rollout_step_cost_from_profile():
    assert rollout_step_cost("prefill_chunk", 512, ROLLOUT) == pytest.approx(0.05)
    assert rollout_step_cost("prefill_chunk", 256, ROLLOUT) == pytest.approx(0.03)
    assert rollout_step_cost("decode", 4, ROLLOUT) == pytest.approx(0.009)  # temporal sharing: D_r(4)
    # rollout tokens riding in one shared batch of 3 serving decodes: D(5) - D(3)
    assert rollout_step_cost("decode", 2, ROLLOUT, serving_batch=3) == pytest.approx(0.002)
    with pytest.raises(ValueError, match="outside 1..512"):
        rollout_step_cost("prefill_chunk", 600, ROLLOUT)
    with pytest.raises(ValueError, match="kind"):
        rollout_step_cost("verify", 1, ROLLOUT)


def test_slo_defaults_from_profile_follow_the_documented_rule():
    slo = SLOConfig.from_profile(SERVING, prompt_len=2048, batch=16)
    assert slo.ttft_s == pytest.approx(4 * 0.2048)  # 4 x P_mono(2048), extrapolated
    assert slo.tpot_s == pytest.approx(5 * 0.085)  # 5 x D(16) = 5 x (0.01 + 15 * 0.005)
    flat = Curve((1, 2), (1e-4, 1e-4))
    tiny = LatencyProfile(flat, flat, flat)
    floor = SLOConfig.from_profile(tiny)
    assert (floor.ttft_s, floor.tpot_s) == (0.05, 0.02)
    assert SLOConfig.paper_7b() == SLOConfig(ttft_s=0.5, tpot_s=0.15)
