"""The `serving-replay` deployment: replay a window of a serving trace against endpoints.

Wraps replay/job.py (the same code as `rose serve replay`); the request form is a
pydantic model, so the Prefect UI validates it, and the TTFT/TPOT percentiles and SLO
attainment become a table artifact.
"""
from __future__ import annotations

from prefect import flow

from replay.job import ReplayJob


def summary_rows(summary: dict) -> list[dict]:
    def ms(v):
        return "n/a" if v is None else f"{v * 1000:.1f} ms"

    rows = [("requests", summary["requests"]), ("errors", summary["errors"])]
    rows += [(f"{m.upper()} p{q}", ms(summary.get(f"{m}_p{q}_s")))
             for m in ("ttft", "tpot") for q in (50, 95, 99)]
    att = summary.get("slo_attainment")
    rows.append(("SLO attainment", "n/a" if att is None else f"{att:.1%}"))
    return [{"metric": k, "value": str(v)} for k, v in rows]


@flow(name="serving-replay", log_prints=True)
def serving_replay(request: ReplayJob) -> dict:
    from prefect.artifacts import create_table_artifact
    from rich.console import Console

    from replay.job import run_replay

    summary = run_replay(request, Console(width=120))
    create_table_artifact(summary_rows(summary), key="serving-replay",
                          description=f"trace replay against {', '.join(request.endpoints)}; "
                                      f"files in {summary['out_dir']}")
    return summary
