"""The stack's co-execution group table (coordination/coexec_groups.py): admission through the
policy, a refused run in a group of its own, a run that cannot fit anywhere named with the memory,
phase turns shared through the file, silent members dropped, measured phase times kept."""
import time

import pytest

from executors.policies.coexec_group import ROLLOUT, TRAIN, CoexecGroupError, PoolLimits, RunProfile
from flows.coexec import parked_bytes, run_shape
from core.config import RunConfig
from coordination.coexec_groups import CoexecGroups

GIB = 2**30
ROOM = PoolLimits(4 * GIB, 4 * GIB)


def profile(run: str, rollout_s: float = 10.0, train_s: float = 10.0, parked: int = GIB) -> RunProfile:
    return RunProfile(run, rollout_s, train_s, parked, parked, slo_factor=1.5)


def test_balanced_runs_share_a_group_and_take_turns(tmp_path):
    groups = CoexecGroups(tmp_path)
    assert groups.join("g", profile("a"), ROOM).reason == ""
    joined = groups.join("g", profile("b"), ROOM)
    assert joined.group == "g" and not joined.new_group and joined.reason == ""
    assert groups.groups() == {"g": ["a", "b"]}
    # a rolls out first, so b's rollout waits; a's training is next on the trainer pool
    assert not groups.take_turn("g", ROLLOUT, "b") and groups.take_turn("g", ROLLOUT, "a")
    assert not groups.take_turn("g", ROLLOUT, "b")  # b's turn, but a still holds the pool
    groups.give_back("g", ROLLOUT, "a")
    assert not groups.take_turn("g", ROLLOUT, "a") and groups.take_turn("g", ROLLOUT, "b")
    assert not groups.take_turn("g", TRAIN, "b") and groups.take_turn("g", TRAIN, "a")  # a trains, b rolls out
    groups.give_back("g", TRAIN, "a")
    assert CoexecGroups(tmp_path).take_turn("g", TRAIN, "b")  # another driver reads the same file


def test_a_run_that_would_break_the_slo_goes_to_its_own_group_and_says_why(tmp_path):
    groups = CoexecGroups(tmp_path)
    groups.join("g", profile("a"), ROOM)
    placed = groups.join("g", profile("big", rollout_s=40.0, train_s=1.0), ROOM)
    assert placed.group == "big" and placed.new_group
    assert "would slow run" in placed.reason and "its own" in placed.reason
    assert groups.groups() == {"g": ["a"], "big": ["big"]}


def test_no_room_in_the_group_or_anywhere_names_the_run_and_the_memory(tmp_path):
    groups = CoexecGroups(tmp_path)
    groups.join("g", profile("a", parked=3 * GIB), ROOM)
    placed = groups.join("g", profile("b", parked=2 * GIB), ROOM)
    assert placed.group == "b" and "run b does not fit group g" in placed.reason and "4.0 GiB" in placed.reason
    with pytest.raises(CoexecGroupError, match=r"run huge .*5\.0 GiB parked by huge"):
        groups.join("g", profile("huge", parked=5 * GIB), ROOM)
    assert "huge" not in str(groups.groups())


def test_a_member_that_stops_renewing_is_dropped_and_others_stop_waiting(tmp_path):
    groups = CoexecGroups(tmp_path, ttl_s=0.4)
    groups.join("g", profile("a"), ROOM)
    groups.join("g", profile("b"), ROOM)
    assert not groups.take_turn("g", ROLLOUT, "b")  # a's turn
    time.sleep(0.25)
    groups.renew("b")  # b's driver renews; a's went silent
    time.sleep(0.25)
    assert groups.take_turn("g", ROLLOUT, "b") and groups.members("g") == ["b"]
    groups.leave("b")
    assert groups.groups() == {}
    with pytest.raises(RuntimeError, match="no longer in co-execution group g"):
        groups.take_turn("g", TRAIN, "b")


def test_solo_phase_times_are_kept_per_run_and_per_shape(tmp_path):
    groups = CoexecGroups(tmp_path)
    assert groups.solo_times("a", "shape1") is None
    groups.record_phase_times("a", "shape1", 3.0, 2.0, solo=True)
    groups.record_phase_times("a", "shape1", 9.0, 9.0, solo=False)  # co-executed: not T_solo
    assert groups.solo_times("a", "shape1") == (3.0, 2.0)
    groups.record_phase_times("b", "shape1", 5.0, 4.0, solo=True)
    assert groups.solo_times("new", "shape1") == (4.0, 3.0)  # a new run of the same shape: the mean
    assert groups.solo_times("b", "shape1") == (5.0, 4.0)  # its own first
    assert groups.solo_times("new", "other") is None


def test_run_shape_and_parked_state_of_a_config(tmp_path):
    cfg = RunConfig(run_id="x")
    assert run_shape(cfg) == run_shape(cfg.model_copy(update={"run_id": "y"}))
    assert run_shape(cfg) != run_shape(RunConfig(run_id="x", rollout={"groups": 3}))
    policy = cfg.models.policy_path()
    if not any(policy.glob("*.safetensors")):
        pytest.skip("the demo policy is not built here")
    rollout_b, train_b = parked_bytes(cfg)
    assert rollout_b > 0 and train_b == 7 * rollout_b  # bf16 copy vs fp32 + AdamW + bf16 snapshot
