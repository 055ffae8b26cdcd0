"""Where the dashboards are: `rose dashboard`'s default port and a page's address, for the links
that `rose up`, `rose train` and each step's Prefect artifact print (no Bokeh import)."""
from __future__ import annotations

DEFAULT_PORT = 5006


def page_url(page: str = "runs", run: str | None = None, port: int = DEFAULT_PORT) -> str:
    return f"http://127.0.0.1:{port}/{page}" + (f"?runs={run}" if run else "")
