import pytest

from executors.policies.stall import StallDetector, StallReport


def test_request_without_progress_for_timeout_is_reported_once_and_dropped():
    d = StallDetector(timeout_s=2.0)
    d.on_admit("a", now=0.0, trajectory_id="ta")
    d.on_admit("b", now=0.5, trajectory_id="tb")
    assert d.on_progress("a", now=1.0)
    assert d.check(2.4) == []  # b idle 1.9 s
    assert d.check(2.5) == [StallReport("b", "tb", 2.0)]
    assert "b" not in d and len(d) == 1
    assert d.check(2.9) == []  # not reported twice
    assert not d.on_progress("b", now=3.0)  # a late event does not resurrect it
    assert d.check(3.0) == [StallReport("a", "ta", 2.0)]
    assert len(d) == 0


def test_progress_keeps_a_request_alive_and_finish_stops_watching():
    d = StallDetector(timeout_s=2.0)
    d.on_admit("a", now=0.0)
    for t in (1.5, 3.0, 4.5):
        d.on_progress("a", now=t)
        assert d.check(t + 1.9) == []
    d.on_finish("a")
    assert d.check(100.0) == []
    d.on_finish("a")  # finishing twice is harmless


def test_several_stalls_longest_idle_first_and_trajectory_defaults_to_request():
    d = StallDetector(timeout_s=1.0)
    d.on_admit("x", now=2.0)
    d.on_admit("y", now=0.0)
    d.on_progress("y", now=1.0)
    reports = d.check(5.0)
    assert [(r.request_id, r.trajectory_id) for r in reports] == [("y", "y"), ("x", "x")]
    assert [r.idle_s for r in reports] == pytest.approx([4.0, 3.0])


def test_progress_never_moves_backwards():
    d = StallDetector(timeout_s=2.0)
    d.on_admit("a", now=5.0)
    d.on_progress("a", now=1.0)  # an out-of-order event with an older time
    assert d.check(6.5) == []


def test_bad_use_is_rejected():
    with pytest.raises(ValueError, match="timeout"):
        StallDetector(timeout_s=0)
    d = StallDetector()
    d.on_admit("a", now=0.0)
    with pytest.raises(ValueError, match="already"):
        d.on_admit("a", now=1.0)


def test_a_started_turn_starved_by_serving_slack_is_kept_not_thrown_away():
    from executors.policies.stall import keep_stalled

    # started, denied for serving slack 0.5 s ago (stall window 2 s): kept, up to 4 times
    assert keep_stalled(True, 0, 0.5, 2.0) and keep_stalled(True, 3, 0.5, 2.0)
    assert not keep_stalled(True, 4, 0.5, 2.0)  # then aborted: rerouted
    assert not keep_stalled(False, 0, 0.5, 2.0)  # not started: nothing lost by rerouting it
    assert not keep_stalled(True, 0, 3.0, 2.0)  # no slack denial in the window: stuck on KV
