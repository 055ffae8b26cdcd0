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
from tests.dashboard_fixtures import RUNS, STEPS, recorded, step_summary  # noqa: F401


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
    drawn = assert_all_drawn(build(serving, recorded, ["r1"]), 5)
    ttft = drawn["TTFT P99 per step (dashed: the worker's SLO)"]
    sources = {r.glyph.y: r.data_source.data for r in ttft}
    assert sources["ttft_ms"]["ttft_ms"] == pytest.approx([80.0, 160.0, 240.0])
    assert sources["slo_ttft_ms"]["slo_ttft_ms"] == [500.0] * 3


def test_routing_page_counts_turns_per_worker(recorded):
    layout = build(routing, recorded, ["r1"])
    drawn = assert_all_drawn(layout, 4)
    bars = drawn["Turns per worker per step: r1"]
    data = bars[0].data_source.data
    assert data["rollout-0 (rollout)"] == [4, 4, 4] and data["serving-0 (serving)"] == [1, 1, 1]


def test_transfer_page_draws_each_publish(recorded):
    drawn = assert_all_drawn(build(transfer, recorded, list(RUNS)), 4)
    mb = drawn["Bytes shipped per publish"][0].data_source.data["publish_mb"]
    assert mb == pytest.approx([2.000001, 2.000002, 2.000003])


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
