"""Trace replay: window selection, peak finding and scaling on the real Azure code trace
(checked against an independent csv/datetime reading of the file), the open-loop replay,
its summary, and the trace's attribution on everything written."""
from __future__ import annotations

import asyncio
import csv
import json
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from replay.replayer import RequestRecord, replay, summarize, write_results
from core.trace import (DEFAULT_TRACE, ReplayRequest, Scaling, Trace, busiest_bin,
                              load_trace, peak_window_start, plan, synthetic_prompt, trace_notice)



@pytest.fixture(scope="module")
def trace() -> Trace:
    return load_trace(DEFAULT_TRACE)


@pytest.fixture(scope="module")
def rows() -> list[tuple[datetime, int, int]]:
    """The trace read independently: csv module + datetime (microseconds are enough here)."""
    with open(DEFAULT_TRACE) as f:
        return [(datetime.strptime(r["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f"),
                 int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]


def _count_between(rows, lo_s: float, hi_s: float) -> int:
    t0 = rows[0][0]
    return sum(lo_s <= (t - t0).total_seconds() < hi_s for t, _, _ in rows)


def test_loads_the_whole_trace(trace, rows):
    # NOTICE.md: 8,819 requests over 3,436 s.
    assert len(trace) == len(rows) == 8819
    assert round(trace.span_s) == 3436
    assert np.all(np.diff(trace.arrival_s) >= 0)
    # First rows of the file: 18:17:03.9799600 (4808, 10), then 18:17:04.0319600 (3180, 8).
    assert trace.arrival_s[0] == 0.0
    assert trace.arrival_s[1] == pytest.approx(0.052, abs=1e-9)
    assert (trace.context_tokens[0], trace.generated_tokens[0]) == (4808, 10)
    assert (trace.context_tokens[1], trace.generated_tokens[1]) == (3180, 8)


def test_busiest_second_is_the_noticed_burst(trace, rows):
    start, count = busiest_bin(trace, 1.0)
    assert count == 67  # NOTICE.md: busiest second 67 req/s
    assert _count_between(rows, start, start + 1) == 67
    # ~26x the mean rate (NOTICE.md), so a window around it contains the largest burst.
    assert count / (len(trace) / trace.span_s) == pytest.approx(26, abs=0.5)


def test_peak_window_is_centered_and_kept_inside(trace):
    peak, _ = busiest_bin(trace, 1.0)
    start = peak_window_start(trace, 600)
    assert start == pytest.approx(peak + 0.5 - 300)
    window = trace.window(start, 600)
    assert window.arrival_s[0] >= start and window.arrival_s[-1] < start + 600
    assert len(window.window(peak, 1.0)) == 67  # the whole burst is inside
    assert peak_window_start(trace, 10_000) == 0.0  # longer than the trace: from its start


def test_peak_window_clamps_at_the_ends():
    arrivals = np.array([0.0, 9.1, 9.2, 9.3, 9.4])  # burst at the very end of a 9.4 s trace
    small = Trace(arrivals, np.ones(5, dtype=np.int64), np.ones(5, dtype=np.int64))
    assert busiest_bin(small, 1.0) == (9.0, 4)
    assert peak_window_start(small, 4.0) == pytest.approx(5.4)  # span - duration, not 7.5
    w = small.window(5.4, 4.0)
    assert list(w.arrival_s) == [9.1, 9.2, 9.3]  # [5.4, 9.4): the end is excluded


def test_window_matches_an_independent_count(trace, rows):
    for lo, hi in ((0, 1), (100, 160), (862, 863)):
        assert len(trace.window(lo, hi - lo)) == _count_between(rows, lo, hi)
    with pytest.raises(ValueError, match="duration"):
        trace.window(0, 0)


def test_scaling_of_lengths_and_time(trace):
    head = trace.window(0, 0.1)  # rows 0..: 4808/10 at 0.0, 3180/8 at 0.052
    reqs = plan(head, Scaling(time_scale=0.5, length_scale=0.1, max_model_len=2048))
    assert (reqs[0].prompt_len, reqs[0].max_tokens) == (481, 1)  # round(4808*.1), round(10*.1)
    assert (reqs[1].prompt_len, reqs[1].max_tokens) == (318, 1)
    assert reqs[1].send_at_s == pytest.approx(0.026)  # 0.052 s of trace at half time
    full = plan(head, Scaling(length_scale=1.0, output_scale=2.0, max_model_len=2048))
    assert (full[0].prompt_len, full[0].max_tokens) == (2047, 1)  # clamped to the context
    assert (full[1].prompt_len, full[1].max_tokens) == (2047, 1)
    tiny = plan(head, Scaling(length_scale=1e-6, output_scale=3.0))
    assert (tiny[0].prompt_len, tiny[0].max_tokens) == (1, 30)  # at least one prompt token


def test_sampling_is_seeded_and_partial(trace):
    window = trace.window(0, 600)
    a = plan(window, Scaling(sample=0.25, seed=1))
    b = plan(window, Scaling(sample=0.25, seed=1))
    assert [r.trace_row for r in a] == [r.trace_row for r in b]
    assert 0.15 * len(window) < len(a) < 0.35 * len(window)
    assert [r.index for r in a] == list(range(len(a)))
    assert len(plan(window, Scaling())) == len(window)


@pytest.mark.parametrize("kwargs,match", [({"time_scale": 0}, "time_scale"),
                                          ({"length_scale": -1}, "length_scale"),
                                          ({"sample": 1.5}, "sample"),
                                          ({"max_model_len": 1}, "max_model_len")])
def test_bad_scaling_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Scaling(**kwargs)


def test_synthetic_prompts_are_seeded_per_request():
    r = ReplayRequest(0, 5, 0.0, 0.0, 300, 4, 3000, 40)
    p = synthetic_prompt(r, 496, seed=3, low=4)
    assert len(p) == 300 and min(p) >= 4 and max(p) < 496
    assert p == synthetic_prompt(r, 496, seed=3, low=4)
    assert p != synthetic_prompt(r, 496, seed=4, low=4)
    other = ReplayRequest(1, 6, 0.0, 0.0, 300, 4, 3000, 40)
    assert p != synthetic_prompt(other, 496, seed=3, low=4)


def _rec(i, ttft, tpot, n=5, ok=True):
    return RequestRecord(i, 0.0, 0.0, 0.0, 10, n, n if ok else 0, ttft, tpot, ttft, ok)


def test_summary_attainment_by_hand():
    records = [_rec(0, 0.1, 0.01), _rec(1, 0.2, 0.05), _rec(2, 0.6, 0.01),
               _rec(3, 0.3, float("nan"), n=1), _rec(4, math.nan, math.nan, ok=False)]
    s = summarize(records, ttft_slo_s=0.5, tpot_slo_s=0.02)
    assert (s["requests"], s["ok"], s["errors"]) == (5, 4, 1)
    assert s["ttft_attainment"] == pytest.approx(3 / 5)  # 0.6 misses, the failure misses
    assert s["tpot_attainment"] == pytest.approx(3 / 5)  # 0.05 misses; n=1 has no TPOT
    assert s["slo_attainment"] == pytest.approx(2 / 5)  # requests 0 and 3
    assert s["ttft_p50_s"] == pytest.approx(0.25)  # median of 0.1, 0.2, 0.3, 0.6
    assert s["tpot_p50_s"] == pytest.approx(0.01)  # over the 3 multi-token requests


def test_open_loop_replay_sends_everything_in_order():
    reqs = [ReplayRequest(i, i, i * 0.01, i * 0.002, 8, 3, 80, 3) for i in range(20)]
    sent: list[int] = []

    async def send(req, prompt, rec):
        sent.append(req.index)
        if req.index == 3:
            raise RuntimeError("boom")  # one failure stays one failed record
        await asyncio.sleep(0.01)  # slower than the arrivals: sends must not wait for it
        rec.ok, rec.output_tokens, rec.ttft_s = True, 3, 0.01

    records = asyncio.run(replay(reqs, send, vocab_size=100, seed=0))
    assert sent == list(range(20))
    assert [r.ok for r in records].count(False) == 1 and "boom" in records[3].error


def test_notice_travels_with_results(tmp_path):
    notice = trace_notice(DEFAULT_TRACE)
    assert "CC BY 4.0" in notice and "Splitwise" in notice and "Modified" in notice
    records = [_rec(0, 0.1, 0.01)]
    paths = write_results(tmp_path, records, summarize(records), notice, {"window_s": 60})
    assert "CC BY 4.0" in paths["notice"].read_text()
    assert json.loads(paths["summary"].read_text())["trace_notice"] == notice
    meta = pq.read_table(paths["requests"]).schema.metadata
    assert meta[b"trace_notice"].decode() == notice
    bare = tmp_path / "t" / "trace.csv"
    bare.parent.mkdir()
    bare.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(FileNotFoundError, match="NOTICE"):
        trace_notice(bare)
    assert "No NOTICE.md" in trace_notice(bare, required=False)  # a user's own trace: said


def test_public_trace_formats_load_alike(tmp_path):
    """BurstGPT (CSV, seconds), Mooncake (JSON lines, milliseconds) and a generic CSV give the
    same arrivals and lengths, re-based to the first request and sorted by arrival."""
    burst = tmp_path / "burstgpt.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "45,ChatGPT,1087,250,1337,Conversation log\n5,ChatGPT,472,18,490,Conversation log\n")
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text('{"timestamp": 5000, "input_length": 472, "output_length": 18, "hash_ids": [1]}\n'
                        '{"timestamp": 45000, "input_length": 1087, "output_length": 250, "hash_ids": [2]}\n')
    generic = tmp_path / "mine.csv"
    generic.write_text("arrival_s,prompt_tokens,output_tokens\n5.0,472,18\n45.0,1087,250\n")
    for path in (burst, mooncake, generic):
        t = load_trace(path)
        assert t.arrival_s.tolist() == [0.0, 40.0], path.name
        assert t.context_tokens.tolist() == [472, 1087] and t.generated_tokens.tolist() == [18, 250]


def test_unknown_trace_columns_are_refused_naming_the_formats(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("when,in,out\n1,2,3\n")
    with pytest.raises(ValueError, match=r"columns \['in', 'out', 'when'\].*BurstGPT.*Mooncake"):
        load_trace(bad)
    neg = tmp_path / "neg.csv"
    neg.write_text("arrival_s,prompt_tokens,output_tokens\n1,-2,3\n")
    with pytest.raises(ValueError, match="negative"):
        load_trace(neg)


def test_trace_and_notice_ship_in_the_repository():
    repo = Path(__file__).resolve().parents[1]
    assert DEFAULT_TRACE.is_relative_to(repo) and DEFAULT_TRACE.is_file()
    assert "CC BY 4.0" in DEFAULT_TRACE.with_name("NOTICE.md").read_text()


def test_cli_replays_against_an_endpoint(tmp_path):
    from typer.testing import CliRunner

    from executors.coserving.endpoint.app import start_endpoint, stop_endpoint
    from fake_serving import FakeServingExecutor
    from rose.cli import app

    ep = start_endpoint(FakeServingExecutor(token_s=0.0005), _tiny_model_dir(tmp_path),
                        worker="replay-test")
    try:
        out = tmp_path / "out"
        res = CliRunner().invoke(app, ["serve", "replay", "--endpoint", ep.url, "--start", "862",
                                       "--duration", "2", "--time-scale", "0.25",
                                       "--length-scale", "0.01", "--output-scale", "0.5",
                                       "--slo-ttft", "5", "--slo-tpot", "1", "--out", str(out)])
        assert res.exit_code == 0, res.output
        doc = json.loads((out / "summary.json").read_text())
        n = len(load_trace(DEFAULT_TRACE).window(862, 2))
        assert doc["summary"]["requests"] == n and doc["summary"]["errors"] == 0
        assert (out / "NOTICE.md").is_file() and "CC BY 4.0" in doc["trace_notice"]
        bad = CliRunner().invoke(app, ["serve", "replay", "--endpoint", ep.url, "--start", "0",
                                       "--around-peak", "--out", str(out)])
        assert bad.exit_code == 1 and "either --start or --around-peak" in bad.output
    finally:
        stop_endpoint("replay-test")


def _tiny_model_dir(tmp_path: Path) -> Path:
    from fake_serving import fake_model_dir

    return fake_model_dir(tmp_path / "model", vocab_size=300, context=2048)


def test_coserving_bench_refuses_a_trace_without_notice_before_running(tmp_path):
    """Run as a user runs it: an empty trace is refused before anything starts, its missing
    NOTICE.md said."""
    import subprocess
    import sys

    bare = tmp_path / "trace.csv"
    bare.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    done = subprocess.run([sys.executable, "-m", "bench.coserving.coserving", "--trace", str(bare)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode == 2, done.stderr  # argparse's error: nothing ran
    assert "NOTICE.md" in done.stderr and "has no requests" in done.stderr
