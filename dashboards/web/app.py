"""`rose dashboard`: a Bokeh server on 127.0.0.1 with one app per page (/runs, /serving, /routing,
/transfer). Bokeh, because the Dask dashboard already runs on it: plain Python callbacks on a
Tornado server, no JavaScript to build. Each browser session reads the recorded data through
DuckDB, draws its page, and looks again every REFRESH_MS: new steps update the figures in
place, a new series (a run picked, a worker appearing) redraws the page."""
from __future__ import annotations

from functools import partial
from pathlib import Path
from types import ModuleType

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, Div, MultiChoice

from dashboards.web import routing, runs, serving, transfer
from dashboards.web.data import list_runs, load

PAGES: dict[str, ModuleType] = {"runs": runs, "serving": serving, "routing": routing,
                                "transfer": transfer}
REFRESH_MS = 3000


class PageSession:
    """One browser tab on one page: the runs it shows, its data sources, the periodic refresh."""

    def __init__(self, doc, page: ModuleType, data_dir: Path, picked: list[str] | None = None):
        self.doc, self.page, self.data_dir = doc, page, Path(data_dir)
        self.runs = picked or list_runs(self.data_dir)[:1]  # the most recent run by default
        self.sources: dict[tuple, ColumnDataSource] = {}
        self.draw()
        doc.add_periodic_callback(self.refresh, REFRESH_MS)

    def draw(self, data: dict | None = None) -> None:
        data = self.page.data(load(self.data_dir, self.runs)) if data is None else data
        self.sources = {key: ColumnDataSource(cols) for key, cols in data.items()}
        self.picker = MultiChoice(title="runs (overlaid)", value=list(self.runs),
                                  options=list_runs(self.data_dir), width=900)
        self.picker.on_change("value", lambda _attr, _old, new: self.pick(new))
        body = self.page.layout(self.sources) if data else Div(text=(
            f"<p>No recorded steps for these runs under <code>{self.data_dir}</code> yet: "
            "each RL step adds its row when it ends (<code>rose train</code>).</p>"))
        self.doc.clear()
        self.doc.add_root(column(navigation(self.page), self.picker, body))
        self.doc.title = f"ROSE · {self.page.TITLE}"

    def pick(self, picked: list[str]) -> None:
        self.runs = list(picked)
        self.draw()

    def refresh(self) -> None:
        known = list_runs(self.data_dir)
        if self.picker.options != known:  # a run started since
            self.picker.options = known
        if not self.runs:  # opened before any step ended: show the first run that appears
            self.runs = known[:1]
        data = self.page.data(load(self.data_dir, self.runs))
        if {k: list(v) for k, v in data.items()} != {k: list(s.data) for k, s in
                                                     self.sources.items()}:
            self.draw(data)  # new series or columns: new glyphs
            return
        for key, cols in data.items():
            self.sources[key].data = cols


def navigation(current: ModuleType) -> Div:
    links = " · ".join(f"<b>{m.TITLE}</b>" if m is current else f'<a href="/{name}">{m.TITLE}</a>'
                       for name, m in PAGES.items())
    return Div(text=f"<h2 style='margin:4px 0'>ROSE dashboards</h2><p>{links}</p>")


def start_session(doc, page: ModuleType, data_dir: Path) -> None:
    """A new browser session on `page`; `?runs=a,b` picks the runs shown."""
    args = doc.session_context.request.arguments if doc.session_context else {}
    picked = [r for v in args.get("runs", []) for r in v.decode().split(",") if r]
    PageSession(doc, page, data_dir, picked)


def make_server(data_dir: Path, port: int, address: str = "127.0.0.1"):
    """The Bokeh server with every page (not started)."""
    from bokeh.server.server import Server

    apps = {f"/{name}": Application(FunctionHandler(partial(start_session, page=page,
                                                            data_dir=Path(data_dir))))
            for name, page in PAGES.items()}
    return Server(apps, address=address, port=port, num_procs=1,
                  allow_websocket_origin=[f"{address}:{port}", f"localhost:{port}"])


def serve(data_dir: Path, port: int, address: str = "127.0.0.1") -> None:
    """Serve until interrupted."""
    server = make_server(data_dir, port, address)
    server.start()
    try:
        server.io_loop.start()
    finally:
        server.stop()
