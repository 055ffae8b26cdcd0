"""The browser dashboards' pages, built from a small recorded data directory without a browser:
every figure gets glyphs with data, a page session draws and refreshes in place."""
from __future__ import annotations

import math

import pytest
from bokeh.document import Document
from bokeh.models import ColumnDataSource, GlyphRenderer, Plot

from dashboards.web import routing, runs, serving, transfer
from dashboards.web.app import PageSession
from dashboards.web.data import list_runs, load
from storage.metrics.store import StepMetricsStore
from tests.dashboard_fixtures import RUNS, STEPS, T0, publish, recorded, step_summary  # noqa: F401


def build(page, data_dir, picked):
    data = page.data(load(data_dir, picked))
    return page.layout({k: ColumnDataSource(v) for k, v in data.items()})


def y_column(glyph) -> str:
    """The data column a glyph draws: a line's y, a stacked bar's own (last) stacker."""
    spec = getattr(glyph, "y", None) or glyph.top
    if isinstance(spec, str):
        return spec
    expr = spec["expr"] if isinstance(spec, dict) else spec.expr
    return expr.fields[-1]


def plots(layout) -> dict[str, list[GlyphRenderer]]:
    """title -> the figure's glyph renderers that hold at least one finite value."""
    out = {}
    for plot in layout.select({"type": Plot}):
        out[plot.title.text] = [
            r for r in plot.select({"type": GlyphRenderer})
            if any(v is not None and not (isinstance(v, float) and math.isnan(v))
                   for v in r.data_source.data[y_column(r.glyph)])]
    return out


def assert_all_drawn(layout, count: int) -> dict[str, list]:
    drawn = plots(layout)
    assert len(drawn) == count, list(drawn)
    assert all(drawn.values()), [t for t, rs in drawn.items() if not rs]
    return drawn


def test_runs_page_overlays_runs_and_stacks_phases(recorded):
    drawn = assert_all_drawn(build(runs, recorded, list(RUNS)), 4 + len(RUNS))
    reward = drawn["Mean trajectory reward"]
    assert {r.data_source.data["step"] == list(STEPS) for r in reward} == {True}
    fig = next(p for p in build(runs, recorded, list(RUNS)).select({"type": Plot})
               if p.title.text == "Mean trajectory reward")
    assert [item.label.value for item in fig.legend[0].items] == list(RUNS)
    assert len(drawn["Phase seconds per step: r1"]) == len(runs.PHASES)


def test_serving_page_draws_p99s_against_the_slo(recorded):
    drawn = assert_all_drawn(build(serving, recorded, ["r1"]), 10)
    ttft = drawn["TTFT P99 per step (dashed: the worker's SLO)"]
    sources = {r.glyph.y: r.data_source.data for r in ttft}
    assert sources["ttft_ms"]["ttft_ms"] == pytest.approx([80.0, 160.0, 240.0])
    assert sources["slo_ttft_ms"]["slo_ttft_ms"] == [500.0] * 3
    denied = drawn["Rollout steps denied per step, by reason (and users yielded to)"]
    by_reason = {r.glyph.y: r.data_source.data[r.glyph.y] for r in denied}
    assert by_reason["rollout_denied_tpot"] == [5, 10, 15]
    assert by_reason["rollout_yielded_to_users"] == [0, 1, 2]
    wake = drawn["Rollout engine's last wake: rebuilt + the run's weights loaded"][0].data_source.data
    assert all(math.isnan(w) for w in wake["wake_s"][:2]) and wake["wake_s"][2] == 1.5
    back = drawn["Memory given back to serving while the rollout engine is parked"][0].data_source.data
    assert math.isnan(back["given_back_mib"][0]) and back["given_back_mib"][1] == 3.0  # parked in step 2
    assert math.isnan(back["given_back_mib"][2])


def test_routing_page_counts_turns_per_worker(recorded):
    layout = build(routing, recorded, ["r1"])
    drawn = assert_all_drawn(layout, 5)
    bars = drawn["Turns per worker per step: r1"]
    data = bars[0].data_source.data
    assert data["rollout-0 (rollout)"] == [4, 4, 4] and data["serving-0 (serving)"] == [1, 1, 1]


def test_routing_page_draws_the_affinity_hit_rate(recorded):
    drawn = assert_all_drawn(build(routing, recorded, list(RUNS)), 6)
    hits = drawn["Affinity hit rate: turns on their previous turn's worker"]
    assert len(hits) == 2 * len(RUNS)  # a line and its markers per run
    assert hits[0].data_source.data["hit_rate"] == [0.5] * 3  # one of two later turns stayed
    assert hits[0].data_source.data["later_turns"] == [2] * 3


def test_transfer_page_draws_each_publish(recorded):
    drawn = assert_all_drawn(build(transfer, recorded, list(RUNS)), 10 + 2 * len(RUNS))
    sent = {r.glyph.y: r.data_source.data for r in
            drawn["Bytes shipped per publish (dashed: the dense bf16 weights)"]}
    assert sent["sent_mb"]["sent_mb"] == pytest.approx([0.6] * 3)  # from the publish records
    assert sent["dense_mb"]["dense_mb"] == pytest.approx([1.5] * 3)
    link = drawn["Link rate each delta was chosen by (publish.link_gbps, or measured)"]
    assert len({id(r.data_source) for r in link}) == len(RUNS)  # one series per run
    assert link[0].data_source.data["link_gbps"] == pytest.approx([10.0 / s for s in STEPS])
    speed = {r.glyph.y: r.data_source.data for r in drawn[
        "This host's speed against the time model's fitted costs: coding (median of the "
        "codings' encode), raw (dashed)"]}
    # the codings' median encode factor (ef 2.0, ternary 1 + step), raw's apart; not measured
    # at the first publish
    want = [math.nan if s == 1 else (3.0 + s) / 2 for s in STEPS]
    assert speed["coding_x"]["coding_x"] == pytest.approx(want, nan_ok=True)
    assert speed["raw_x"]["raw_x"] == pytest.approx([math.nan if s == 1 else 4.0 for s in STEPS],
                                                    nan_ok=True)
    # coded in 2 coder processes, then on the trainer's threads at the last step
    coders = drawn["Coder processes each delta was coded in (0: the trainer's threads, e.g. "
                   "where /dev/shm had no room)"]
    assert coders[0].data_source.data["coders"] == [2 if s < 3 else 0 for s in STEPS]
    # a trainer group's pushes per rank, an engine's pulls, one series each per run
    ranks = {r.data_source: None for r in drawn["Bytes each trainer rank pushed (a megatron group: r<tp>.<pp>.<dp>)"]}
    assert len(ranks) == 2 * len(RUNS)
    assert sorted({tuple(src.data["mb"]) for src in ranks}) == [(0.2,) * 3, (0.4,) * 3]
    pulled = drawn["Bytes each engine pulled"][0].data_source.data
    assert pulled["mb"] == pytest.approx([0.6 * s for s in STEPS])


def test_transfer_page_leaves_out_coders_where_threads_coded_every_delta(recorded):
    import shutil

    shutil.rmtree(recorded / "runs" / "r1" / "transfer")  # publish.coder_processes off: 0
    for step in STEPS:
        publish(recorded / "runs" / "r1", step, coders=0)
    drawn = assert_all_drawn(build(transfer, recorded, ["r1"]), 11)
    assert not [title for title in drawn if title.startswith("Coder processes")]


def test_transfer_page_without_publish_records_ships_the_step_tables_bytes(recorded):
    import shutil

    shutil.rmtree(recorded / "runs")
    drawn = assert_all_drawn(build(transfer, recorded, ["r1"]), 5)
    sent = drawn["Bytes shipped per publish (dashed: the dense bf16 weights)"]
    assert sent[0].data_source.data["sent_mb"] == pytest.approx([2.000001, 2.000002, 2.000003])


def test_transfer_page_encoding_mix_stages_and_lag(recorded):
    drawn = assert_all_drawn(build(transfer, recorded, ["r1"]), 12)
    mix = drawn["Encoding mix: share of the bytes sent per encoding, r1"][0].data_source.data
    assert mix["xor_zstd"] == pytest.approx([1 / 6] * 3)  # of 0.6 MB, 0.1 xor_zstd, 0.5 dense
    assert mix["dense"] == pytest.approx([5 / 6] * 3)
    stages = drawn["Publish stages, s (encode: sum over tensors; pull, apply, load: slowest "
                   "worker): r1"]
    assert len(stages) == len(transfer.STAGES)
    data = stages[0].data_source.data
    assert data["encode_s"] == pytest.approx([0.3] * 3) and data["pull_s"] == [0.3] * 3
    lag = {(r.glyph.y, r.data_source.data["max_lag"][0]) for r in drawn[
        "Policy version lag of each worker's turns: mean (solid), max (dashed)"]}
    assert lag == {("mean_lag", 0), ("mean_lag", 1), ("max_lag", 0), ("max_lag", 1)}


def test_serving_page_draws_kv_blocks_events_and_admission(recorded):
    drawn = assert_all_drawn(build(serving, recorded, ["r1"]), 10)
    kv = drawn["KV blocks, serving vs rollout: serving-0 (markers: memory events)"]
    by_y = {r.glyph.y: r for r in kv}  # (a plot's renderers come in no fixed order)
    samples = by_y["serving_blocks"].data_source.data
    assert samples["serving_blocks"] == [10, 20, 55, 30] * 3
    assert samples["budget_blocks"][:4] == [70, 70, 35, 35]
    assert samples["at"][0] == pytest.approx((T0 + 10) * 1e3)
    events = {r.glyph.marker: r.data_source.data for r in kv if r.glyph.y == "blocks"}
    assert set(events) == {serving.EVENTS[e][0] for e in ("burst", "cut", "freeze")}
    assert events["inverted_triangle"]["count"] == [2] * 3  # the cut aborted 2 turns each step
    assert {"rollout_blocks", "budget_blocks"} <= set(by_y)
    admission = drawn["Rollout admission per second: denied (solid), admitted (dashed)"]
    denied = next(r for r in admission if r.glyph.y == "denied_per_s").data_source.data
    assert math.isnan(denied["denied_per_s"][0]) and denied["denied_per_s"][1:4] == [4, 12, 0]


def test_list_runs_newest_first_and_load_filters(recorded):
    assert list_runs(recorded) == ["r2", "r1"]
    frames = load(recorded, ["r1"])
    assert set(frames.steps["run"]) == {"r1"} and set(frames.workers["run"]) == {"r1"}
    assert load(recorded, []).steps == {}
    StepMetricsStore(recorded / "metrics").write_step("r1", step_summary(4, serving=False))
    attained = load(recorded, ["r1"]).steps["slo_attainment"]  # null: a gap, never a 0
    assert attained[:3] == [0.97] * 3 and math.isnan(attained[3])


def test_session_draws_then_updates_in_place_and_redraws_on_a_new_run(recorded):
    doc = Document()
    session = PageSession(doc, runs, recorded)
    assert session.runs == ["r2"] and doc.roots
    first = dict(session.sources)
    StepMetricsStore(recorded / "metrics").write_step("r2", step_summary(4, 1))
    session.refresh()  # a new step of a shown run: same sources, more rows
    assert session.sources == first
    assert session.sources[("steps", "r2")].data["step"] == [1, 2, 3, 4]
    StepMetricsStore(recorded / "metrics").write_step("r3", step_summary(1))
    session.refresh()  # a run started since: offered in the picker, not drawn unasked
    assert session.picker.options[0] == "r3" and set(session.sources) == set(first)
    session.pick(["r1", "r2"])
    assert set(session.sources) == {("steps", "r1"), ("steps", "r2")}


def test_session_without_data_says_so(tmp_path):
    doc = Document()
    PageSession(doc, serving, tmp_path)
    assert "No recorded steps" in doc.roots[0].children[-1].text
