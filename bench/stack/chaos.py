"""Chaos bench: faults a cluster throws, each injected into a short training run on a fresh
local stack (Mooncake relay), and what the run made of it.

    python -m bench.stack.chaos [--faults 1,2,3] [--steps 2] [--root /tmp/rose-chaos]

Per fault: `rose up` in its own data directory, `rose train` of a few small steps while the
fault (tests/chaos_faults.py) strikes at its phase, any follow-up the fault needs (`rose
resume`), then `rose down`. Each command has a deadline: past it the command is killed and
the row reads "hang". Columns (tests/chaos_stack.py reads them from outside the product):
  recovered   every step trained and checkpointed, no trajectory lost, no row duplicated
  recover s   injection -> the next checkpoint the run wrote (it trained again)
  lost        expected trajectories not whole (turns 0..n, done, advantage) in the Arrow data
  rerouted    turns recorded as rerouted to another worker
  failed      serving requests that failed at the client (rows with a serving replay)
  serving down  the serving downtime the users saw: first failed to first answered request
              after the fault, and the failed requests in that window (rows with a replay);
              row 3 also times the kill to its endpoint's /health answering again
  weights     the final checkpoint equals a trainer replaying the run's own trajectories
              (two stack runs never sample the same trajectories: see weights_check)
Rows are merged into bench/results/chaos.json by fault, so faults can be run one at a time.
"""
from __future__ import annotations

import argparse
import json


from rich.console import Console
from rich.table import Table

from tests.chaos_faults import FAULTS
from tests.chaos_run import run_config, run_fault

from bench.lib.results import RESULTS, write_json
OUT = RESULTS / "chaos.json"


def table(rows: list[dict]) -> Table:
    t = Table(title="Chaos: one fault per short run on the local stack (Mooncake relay)",
              header_style="bold cyan")
    for c in ("fault", "where injected", "recovered", "recover s", "lost", "dup rows",
              "rerouted", "serving down s", "serving failed", "weights = replay"):
        t.add_column(c, justify="left" if c in ("fault", "where injected") else "right")
    for r in rows:
        state = "hang" if r.get("hung") else ("yes" if r["recovered"] else "NO")
        if r["recovered"] and r["injected"].get("resumed") is not None:
            state = "yes, rose resume"
        weights = {True: "equal", False: "DIFFER", None: "n/a"}[r.get("weights_equal")]
        if r.get("weights_equal") and not r.get("weights_moved"):
            weights = "equal, no update"  # zero advantages: the check proves nothing
        t.add_row(f"{r['fault']}. {r['title']}", r["where"], state,
                  "-" if r.get("recover_s") is None else f"{r['recover_s']:.0f}",
                  str(r["trajectories_lost"]), str(r["duplicate_rows"]),
                  str(r.get("rerouted_turns", r["rerouted_rows"])), down_cell(r),
                  serving_cell(r), weights)
    return t


def markdown(rows: list[dict]) -> str:
    """The table as the README shows it (same cells as the rich table)."""
    t = table(rows)
    cells = [[str(c) for c in col._cells] for col in t.columns]
    head = [str(col.header) for col in t.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*cells)]
    return "\n".join(lines)


def _engine_side(r: dict) -> str:
    """The flood step's serving figures as the endpoint recorded them, when the row has them."""
    for workers in (r.get("serving_engine") or {}).values():
        for w, v in workers.items():
            if v.get("requests") and v.get("slo_attainment") is not None:
                return (f"; at {w}'s endpoint: P99 TTFT {v['ttft_p99_s']:.2f} s / TPOT "
                        f"{v['tpot_p99_s'] * 1e3:.0f} ms, {v['slo_attainment']:.0%} met")
    return ""


def down_cell(r: dict) -> str:
    """Serving downtime (first failed to first answered request after the fault) and the
    requests that failed in it; "-" for a row without serving users."""
    if "serving_down_s" not in r:
        return "-"
    down = r["serving_down_s"]
    cell = "never back" if down is None else f"{down:g} ({r['serving_failed_in_down']} failed)"
    if r.get("serving_failed_outside"):
        cell += f"; {r['serving_failed_outside']} failed outside it"
    if r.get("serving_shed"):
        cell += f"; {r['serving_shed']} shed by admission (503)"
    back = r["injected"].get("endpoint_back_s")
    cell += f"; /health back {back:g} s after the kill" if back is not None else ""
    if "serving_holds_final" in r:
        cell += ("; restarted, it holds the final weights" if r["serving_holds_final"]
                 else "; restarted, it does NOT hold the final weights")
    return cell


def serving_cell(r: dict) -> str:
    flood = r["injected"] if "clients" in r["injected"] else None
    if flood is not None:
        return (f"failed {flood['failed']} of {flood['admitted_ok'] + flood['failed']} admitted; "
                f"{flood['refused']} refused {'/'.join(map(str, flood['refused_codes']))} "
                f"({flood['refused_with_retry_after']} Retry-After); admitted P99 TTFT "
                f"{flood['admitted_ttft_p99_s']:g} s vs SLO {flood['slo']['ttft_s']:.2f} s "
                f"({flood['admitted_slo_met']:.0%} met); worker RSS {flood['rss_before_mb']} -> "
                f"{flood['rss_peak_mb']} MB" + _engine_side(r))
    inj = r["injected"]
    if "in_flight" in inj:  # the killed worker's own requests, then the replay around it
        return (f"in flight: {inj['in_flight_failed']} of {inj['in_flight']} failed at the "
                f"client after {inj['in_flight_error_after_s']} s, {inj['in_flight_hung']} hung; "
                f"replay: {r['serving_failed']} of {r['serving_requests']} failed "
                f"({r['serving_failed_after']} sent after the kill, to the gone endpoint)")
    return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(f.key for f in FAULTS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups", type=int, default=4)
    # 4 x 8 trajectories of up to 8 turns: enough for some groups to differ in reward, so
    # GRPO moves the weights and the final-weights check means something
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--root", default="/tmp/rose-chaos")
    parser.add_argument("--markdown", action="store_true",
                        help="print the rows of bench/results/chaos.json as a markdown table")
    parser.add_argument("--models", default=".rose/models", help="built models (rose models "
                        "build); linked into each fault's data directory")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(OUT.read_text())["rows"]))
        return
    console = Console(width=160)
    wanted = args.faults.split(",")
    known = {f.key: f for f in FAULTS}
    rows = []
    for key in wanted:
        row = run_fault(known[key], args, console)
        rows.append(row)
        console.print(table([row]))
        if not row["recovered"]:
            console.print(f"[red]{row.get('error', '')}[/] {row.get('tail', '')}",
                          highlight=False)
        _merge(row, args)
    console.print(table(_merge(None, args)))
    console.print(f"wrote {OUT}")


def _merge(row: dict | None, args) -> list[dict]:
    """Rows of earlier invocations stay (one fault at a time is a valid use); a rerun of a
    fault replaces its row."""
    RESULTS.mkdir(exist_ok=True)
    try:
        rows = {r["fault"]: r for r in json.loads(OUT.read_text())["rows"]}
    except (OSError, ValueError, KeyError):
        rows = {}
    if row is not None:
        rows[row["fault"]] = {**row, "config": run_config(args, {}, row.get("steps"))}
    ordered = [rows[k] for k in sorted(rows, key=lambda k: (int(k.rstrip('abc')), k))]
    write_json(OUT, {"command": "python -m bench.stack.chaos", "rows": ordered}, default=str)
    return ordered


if __name__ == "__main__":
    main()
