"""What every page draws with: a figure over RL steps, one line per series (a run, a worker),
stacked bars per step, and one color per series across a page's figures."""
from __future__ import annotations

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, HoverTool, Legend, NumeralTickFormatter
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

Sources = dict[tuple, ColumnDataSource]
WIDTH, HEIGHT = 660, 250


def color(i: int) -> str:
    return Category10_10[i % len(Category10_10)]


def step_figure(title: str, y_label: str, percent: bool = False, log: bool = False):
    """A figure over RL steps (integer ticks), its legend on the right (a click hides a series)."""
    fig = figure(title=title, width=WIDTH, height=HEIGHT, x_axis_label="RL step",
                 y_axis_label=y_label, tools="pan,box_zoom,wheel_zoom,reset,save",
                 y_axis_type="log" if log else "linear")
    fig.xaxis[0].ticker.min_interval = 1
    fig.xaxis[0].ticker.num_minor_ticks = 0
    if percent:
        fig.yaxis.formatter = NumeralTickFormatter(format="0%")
        fig.y_range.start, fig.y_range.end = 0, 1.02
    fig.add_layout(Legend(click_policy="hide", label_text_font_size="8pt", spacing=0,
                          padding=4, margin=4), "right")
    fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("value", "$y{0.000}")]))
    return fig


def lines(fig, series: dict[str, ColumnDataSource], y: str, dash: str = "solid",
          suffix: str = "") -> None:
    """One line with markers per series (label -> source), colored by its position."""
    for i, (label, source) in enumerate(series.items()):
        kw = dict(source=source, color=color(i), legend_label=label + suffix)
        fig.line("step", y, line_width=2, line_dash=dash, **kw)
        if dash == "solid":
            fig.scatter("step", y, size=6, **kw)


def stacked(fig, source: ColumnDataSource, stackers: list[str], labels: list[str]) -> None:
    colors = [color(i) for i in range(len(stackers))]
    fig.vbar_stack(stackers, x="step", width=0.7, color=colors, source=source,
                   legend_label=labels)


def pick(sources: Sources, kind: str) -> dict[tuple, ColumnDataSource]:
    """The sources of one kind (first element of the key), keyed by the rest of the key."""
    return {key[1:]: src for key, src in sources.items() if key[0] == kind}


def label(key: tuple, runs: int) -> str:
    """A series' legend: its key without the run when only one run is shown."""
    return " · ".join(map(str, key if runs > 1 else key[1:])) or str(key[0])


def grid(figs: list) -> object:
    """Figures two to a row."""
    return column(*[row(*figs[i:i + 2]) for i in range(0, len(figs), 2)])


def time_figure(title: str, y_label: str, log: bool = False):
    """A figure over wall-clock time (UTC), its legend on the right like step_figure's."""
    fig = figure(title=title, width=WIDTH, height=HEIGHT, x_axis_type="datetime",
                 x_axis_label="time (UTC)", y_axis_label=y_label,
                 tools="pan,box_zoom,wheel_zoom,reset,save", y_axis_type="log" if log else "linear")
    fig.add_layout(Legend(click_policy="hide", label_text_font_size="8pt", spacing=0,
                          padding=4, margin=4), "right")
    fig.add_tools(HoverTool(tooltips=[("time", "@at{%T}"), ("value", "$y{0.0}")],
                            formatters={"@at": "datetime"}))
    return fig


def time_lines(fig, series: dict[str, ColumnDataSource], y: str, dash: str = "solid",
               suffix: str = "", width: float = 2) -> None:
    """One line per series over `at` (epoch milliseconds), colored by its position."""
    for i, (name, source) in enumerate(series.items()):
        fig.line("at", y, source=source, color=color(i), line_width=width, line_dash=dash,
                 legend_label=name + suffix)
