"""The co-serving executor's per-step KV timeline (executors/coserving/kv_timeline.py), driven by
a stand-in executor: samples at most every every_s, events as the policy's state moves, bounded."""
from __future__ import annotations

from types import SimpleNamespace

from executors.coserving.kv_timeline import KVTimeline, thinned
from executors.policies.kv_memory import KVMemoryPolicy


def executor(policy=None):
    return SimpleNamespace(policy=policy, rollout=SimpleNamespace(used_blocks=lambda: 4),
                           page_ratio=2.0, total=100, counters={"admitted": 0, "denied": {}},
                           rollout_counters={"leases_expired": 0, "leases_reclaimed": 0,
                                             "prefixes_dropped": 0},
                           serving=SimpleNamespace(used_blocks=lambda: 7))


def test_samples_at_most_every_interval_with_decisions_since_the_last():
    ex, tl = executor(), KVTimeline(every_s=0.5)
    tl.start(100.0)
    for i in range(11):  # 5 s of loop iterations every 0.1 s: one sample per 0.5 s
        ex.counters["admitted"] += 1
        ex.counters["denied"]["ttft_slack"] = 2 * i
        tl.tick(ex, 100.0 + 0.1 * i + 1e-9)
    report = tl.report(ex, 101.05)
    assert [s[0] for s in report["samples"]] == [0.0, 0.5, 1.0, 1.05]
    assert report["samples"][1] == [0.5, 7, 8, None, 5, 10]  # no policy: no budget
    assert sum(s[4] for s in report["samples"]) == 11 - 1  # the first sample is the baseline
    assert report["total_blocks"] == 100 and report["events"] == []


def test_policy_burst_cut_freeze_and_lease_reclaim_are_events():
    policy = KVMemoryPolicy(100, reserve_fraction=0.2)
    policy.start_step(10, 0.0)  # budget 70
    policy.on_rollout_alloc("a", 40, 0.0)
    ex, tl = executor(policy), KVTimeline(every_s=0.5)
    tl.start(0.0)
    tl.tick(ex, 0.0)
    policy.observe_serving(25, 0.1)  # over the watermark (100 - 70 - 20 + 10 = 20): cut
    tl.tick(ex, 0.1)
    policy.on_rollout_free("a")  # the cut's abort is done: frozen
    ex.rollout_counters["leases_expired"] = 3
    tl.tick(ex, 0.6)
    events = tl.report(ex, 0.7)["events"]
    assert [e[1] for e in events] == ["burst", "cut", "freeze", "lease_reclaim"]
    assert events[1][2:] == [25, 40, 35, 1]  # serving, rollout, budget halved, 1 turn aborted
    assert events[3][5] == 3


def test_bounded_samples_thin_to_cover_the_step_and_events_are_capped():
    ex, tl = executor(), KVTimeline(every_s=0.5, max_samples=10, max_events=2)
    tl.start(0.0)
    for i in range(100):
        ex.counters["admitted"] += 1
        tl.tick(ex, 0.5 * i)
    report = tl.report(ex, 50.0)
    assert len(report["samples"]) <= 11 and report["every_s"] > 0.5
    assert report["samples"][-1][0] == 50.0 and sum(s[4] for s in report["samples"]) == 99
    for i in range(5):
        tl._event(ex, 1.0, "burst")
    assert len(tl.events) == 2 and tl.dropped_events == 3


def test_thinning_keeps_every_decision():
    samples = [[i, 0, 0, None, 1, 2] for i in range(5)]
    assert thinned(samples) == [[1, 0, 0, None, 2, 4], [3, 0, 0, None, 2, 4], [4, 0, 0, None, 1, 2]]


def test_a_sample_holds_the_peak_since_the_last_one():
    policy = KVMemoryPolicy(100, reserve_fraction=0.2)
    policy.start_step(0, 0.0)
    ex, tl = executor(policy), KVTimeline(every_s=0.5)
    tl.start(0.0)
    tl.tick(ex, 0.0)
    policy.observe_serving(12, 0.1)  # a short serving request, gone before the next sample
    policy.on_rollout_alloc("a", 9, 0.1)
    tl.tick(ex, 0.1)
    policy.observe_serving(0, 0.2)
    policy.on_rollout_free("a")
    tl.tick(ex, 0.2)
    tl.tick(ex, 0.5)
    tl.tick(ex, 1.0)
    assert [s[1:3] for s in tl.samples] == [[0, 0], [12, 9], [0, 0]]
