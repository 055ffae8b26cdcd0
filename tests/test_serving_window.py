"""The per-step serving report: a window of the serving log, P99s, SLO attainment, and how a
step summary and the closing tables carry it."""
import math

import pytest

from dashboards.progress import serving_users_table, step_table
from executors.coserving.serving_window import ServedRequest, ServingLog, window_report
from replay.background import BackgroundTraffic
from replay.replayer import RequestRecord
from tasks.rollout import share_by_kind
from tasks.serving import serving_summary


def served(t, ttft, tpot, n=8, ok=True):
    return ServedRequest(finished_at=t, ttft_s=ttft, tpot_s=tpot, output_tokens=n, ok=ok)


def test_window_keeps_only_requests_finished_since_the_step_started():
    log = ServingLog(capacity=3)
    for t in (1.0, 2.0, 3.0, 4.0):
        log.add(served(t, 0.01, 0.001))
    assert [r.finished_at for r in log.since(2.5)] == [3.0, 4.0]
    assert [r.finished_at for r in log.since(0.0)] == [2.0, 3.0, 4.0]  # bounded: oldest dropped


def test_attainment_counts_failures_and_each_slo_as_misses():
    reqs = [served(1, 0.01, 0.001), served(1, 0.5, 0.001),  # TTFT miss
            served(1, 0.01, 0.5),  # TPOT miss
            served(1, 0.01, math.nan, n=1),  # one token: no TPOT, meets it
            served(1, 0.01, 0.001, ok=False)]  # failed
    r = window_report(reqs, ttft_slo_s=0.1, tpot_slo_s=0.05)
    assert (r["requests"], r["failed"], r["slo_met"]) == (5, 1, 2)
    assert r["slo_attainment"] == pytest.approx(0.4)
    assert r["ttft_p99_s"] > 0.1  # over ok requests: the slow one counts
    assert window_report([], 0.1, 0.05)["slo_attainment"] is None


def test_serving_summary_pools_workers_and_skips_absent_reports():
    a = {"worker": "serving-0", "requests": 10, "slo_met": 9}
    b = {"worker": "serving-1", "requests": 30, "slo_met": 30}
    s = serving_summary([a, None, b])
    assert s["serving_requests"] == 40 and s["slo_attainment"] == pytest.approx(39 / 40)
    assert set(s["serving"]) == {"serving-0", "serving-1"}
    assert serving_summary([None])["slo_attainment"] is None


def test_share_by_kind_counts_prompt_and_response_tokens():
    rows = [{"worker_kind": "rollout", "num_prompt_tokens": 10, "response_ids": [1, 2]},
            {"worker_kind": "serving", "num_prompt_tokens": 6, "response_ids": [1, 2]},
            {"worker_kind": "rollout", "num_prompt_tokens": 4, "response_ids": []}]
    s = share_by_kind(rows)
    assert s["rollout"] == {"turns": 2, "tokens": 16, "share": pytest.approx(16 / 24)}
    assert s["serving"]["share"] == pytest.approx(8 / 24)


def test_background_traffic_rejects_bad_scaling():
    with pytest.raises(ValueError, match="sample"):
        BackgroundTraffic(sample=0)
    with pytest.raises(ValueError, match="time_scale"):
        BackgroundTraffic(time_scale=-1)


STEP = {"step": 1, "reward": 0.5, "success_rate": 0.5, "tokens": 100, "prefix_cache_hit_rate": 0.8,
        "rollout_s": 1.0, "reward_s": 0.1, "train_s": 2.0, "publish_s": 0.2, "step_s": 3.3,
        "tokens_per_s": 30.0, "serving_workers": 1, "borrowed_share": 0.25,
        "serving_requests": 12, "slo_attainment": 0.75,
        "serving": {"serving-0": {"ttft_p99_s": 0.08, "tpot_p99_s": 0.012, "slo_ttft_s": 0.1,
                                  "slo_tpot_s": 0.02}},
        "by_kind": {"rollout": {"tokens": 75}, "serving": {"tokens": 25}}}


def cells(table):
    return {c.header: list(c.cells) for c in table.columns}


def test_step_table_shows_what_serving_workers_served_and_lent():
    got = cells(step_table([STEP]))
    assert got["borrowed"] == ["25%"] and got["serving req"] == ["12"]
    assert got["TTFT p99"] == ["80 ms"] and got["SLO met"] == ["75.0%"]
    assert "borrowed" not in cells(step_table([{**STEP, "serving_workers": 0}]))


def test_serving_users_table_sets_lent_beside_alone_on_the_same_requests():
    from replay.replayer import summarize

    class Users:
        def __init__(self, ttfts):
            self.records = [RequestRecord(i, 0, 30.0 * i, 0, 8, 4, output_tokens=4, ttft_s=t,
                                          tpot_s=0.01, ok=True) for i, t in enumerate(ttfts)]

        def summary_at(self, ttft, tpot, first=None):
            return summarize([r for r in self.records if first is None or r.send_at_s < first],
                             ttft, tpot)

    alone, lent = Users((0.05, 0.05)), Users((0.05, 0.2, 0.05))  # sent at 0, 30, 60 s
    table, figures = serving_users_table(lent, [STEP], alone, first_s=60)
    got = cells(table)
    assert got["traffic"] == ["serving alone, first 60 s", "while lent, same 60 s",
                              "while lent, whole run"]
    assert got["requests"] == ["2", "2", "3"]
    assert got["SLO met"] == ["100.0%", "50.0%", "66.7%"]
    assert figures["borrowed_share"] == pytest.approx(0.25) and "25%" in table.caption


def test_background_plan_plays_the_trace_again_when_the_run_outlasts_it():
    from replay.background import BackgroundReplay
    from core.trace import load_trace

    span = load_trace().span_s
    users = BackgroundReplay.__new__(BackgroundReplay)  # the plan only: no endpoint here
    users.model = {"max_model_len": 2048}
    users.traffic = BackgroundTraffic(window_s=span)
    once = users._plan()
    users.traffic = BackgroundTraffic(window_s=2.5 * span)
    looped = users._plan()
    sends = [r.send_at_s for r in looped]
    assert sends == sorted(sends) and [r.index for r in looped] == list(range(len(looped)))
    assert 2 * len(once) < len(looped) < 3 * len(once)
    assert looped[len(once)].send_at_s > once[-1].send_at_s  # the second pass follows the first


def test_background_plan_loops_the_reference_window_when_given_a_period():
    """The demo's users replay exactly the window serving alone was measured on, pass after pass."""
    from replay.background import BackgroundReplay

    users = BackgroundReplay.__new__(BackgroundReplay)  # the plan only: no endpoint here
    users.model = {"max_model_len": 2048}
    users.traffic = BackgroundTraffic(period_s=480.0, window_s=480.0)
    reference = users._plan()
    users.traffic = BackgroundTraffic(period_s=480.0, window_s=3 * 480.0)
    looped = users._plan()
    assert reference and all(r.trace_arrival_s < 480.0 for r in looped)
    assert len(looped) == 3 * len(reference)
    period = 480.0 * users.traffic.time_scale
    for k in range(3):  # each pass is the reference, shifted by whole periods
        part = looped[k * len(reference):(k + 1) * len(reference)]
        assert [(r.trace_row, r.prompt_len, r.max_tokens) for r in part] == \
            [(r.trace_row, r.prompt_len, r.max_tokens) for r in reference]
        assert [r.send_at_s for r in part] == pytest.approx([r.send_at_s + k * period for r in reference])
    with pytest.raises(ValueError, match="period_s"):
        BackgroundTraffic(period_s=0)


def test_a_demo_keeps_each_replays_requests_beside_its_summary(tmp_path, monkeypatch):
    """`rose demo`'s users: every request (send time, lateness, TTFT) in the run directory, so a
    missed SLO can be traced to the requests and the moment that missed it."""
    import pyarrow.parquet as pq

    from core.config import RunConfig
    from replay.replayer import summarize
    from rose.launch import keep_user_requests

    class Replay:
        def __init__(self, ttfts):
            self.records = [RequestRecord(i, 0, 0.5 * i, 0.01 * i, 8, 4, output_tokens=4, ttft_s=t,
                                          tpot_s=0.01, ok=t < 1) for i, t in enumerate(ttfts)]

        @property
        def summary(self):
            return summarize(self.records)

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    cfg = RunConfig(run_id="users")
    keep_user_requests(cfg, BackgroundTraffic(period_s=480.0),
                       {"serving_alone": Replay((0.05, 0.06)), "serving_users": Replay((0.05, 0.9, 2.0))})
    lent = pq.read_table(cfg.run_dir() / "serving_users" / "requests.parquet").to_pylist()
    assert [r["ttft_s"] for r in lent] == [0.05, 0.9, 2.0] and [r["ok"] for r in lent] == [True, True, False]
    assert [r["late_s"] for r in lent] == pytest.approx([0.0, 0.01, 0.02])
    assert len(pq.read_table(cfg.run_dir() / "serving_alone" / "requests.parquet")) == 2
    assert (cfg.run_dir() / "serving_users" / "NOTICE.md").read_text()
