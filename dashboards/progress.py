"""What the person at the terminal sees: a live view of phases and a per-step table."""
from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dashboards.events import subscribe

PHASES = ("rollout", "reward", "train", "publish")


def step_table(summaries: list[dict], title: str = "ROSE: RL steps") -> Table:
    """One row per step; with serving workers, also what they served and lent."""
    serving = any(s.get("serving_workers") for s in summaries)
    table = Table(title=title, header_style="bold cyan")
    # with serving columns the short phases (reward, publish) and the cache hit give way
    cols = [c for c in ("step", "reward", "success", "tokens", "cache hit", "rollout s",
                        "reward s", "train s", "publish s", "step s", "tokens/s")
            if not serving or c not in ("cache hit", "reward s", "publish s")]
    if serving:
        cols += ["borrowed", "serving req", "TTFT p99", "TPOT p99", "SLO met"]
    for col in cols:
        table.add_column(col, justify="right")
    for s in summaries:
        cells = {"step": str(s["step"]), "reward": f"{s['reward']:.3f}",
                 "success": f"{s['success_rate']:.0%}", "tokens": f"{s['tokens']:,}",
                 "cache hit": f"{s['prefix_cache_hit_rate']:.0%}",
                 "rollout s": f"{s['rollout_s']:.1f}", "reward s": f"{s['reward_s']:.1f}",
                 "train s": f"{s['train_s']:.1f}", "publish s": f"{s['publish_s']:.1f}",
                 "step s": f"{s['step_s']:.1f}", "tokens/s": f"{s['tokens_per_s']:,.0f}"}
        row = [cells[c] for c in cols if c in cells]  # the serving columns follow
        if serving:
            row += serving_cells(s)
        table.add_row(*row)
    return table


def serving_users_table(users, summaries: list[dict], alone=None,
                        first_s: float = 60.0, slo_note: str | None = None) -> tuple[Table, dict]:
    """What the serving users saw (replay.background.BackgroundReplay), against the serving
    workers' own SLO: with `alone` (the same traffic's first `first_s` seconds replayed before
    the run, nothing training) also those same requests while lent, side by side; and the
    share of rollout tokens the serving workers produced. The table and its figures."""
    slo = next((w for s in summaries for w in (s.get("serving") or {}).values()), None)
    at = (lambda u, first=None: u.summary_at(slo["slo_ttft_s"], slo["slo_tpot_s"], first)) \
        if slo else (lambda u, first=None: u.summary)
    tokens = [k for s in summaries for k in (s.get("by_kind") or {}).items()]
    borrowed = sum(v["tokens"] for k, v in tokens if k == "serving") / \
        (sum(v["tokens"] for _, v in tokens) or 1)
    rows = {"while lent, whole run": at(users)}
    if alone is not None:
        rows = {f"serving alone, first {first_s:.0f} s": at(alone),
                f"while lent, same {first_s:.0f} s": at(users, first_s), **rows}
    table = Table(title="Serving users (HTTP replay of the code trace), against the serving "
                  "worker's SLO" + (f" {_ms(slo['slo_ttft_s'])} TTFT / {_ms(slo['slo_tpot_s'])} "
                                     "TPOT" if slo else ""), header_style="bold cyan")
    for col in ("traffic", "requests", "failed", "TTFT p50/p99", "TPOT p50/p99", "SLO met"):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        att = r.get("slo_attainment")
        table.add_row(name, f"{r['requests']:,}", str(r["errors"]),
                      f"{_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])}",
                      f"{_ms(r['tpot_p50_s'])} / {_ms(r['tpot_p99_s'])}",
                      "n/a" if att is None else f"{att:.1%}")
    refused = sum(r.get("refused", 0) for r in rows.values())
    table.caption = (f"rollout tokens generated on the serving workers: {borrowed:.0%}; "
                     f"users refused (503): {refused}"
                     + (f"\nwhile lent, users replay the serving-alone {first_s:.0f} s back to back"
                        if alone is not None else "")
                     + (f"\nSLO {slo_note}" if slo_note else ""))
    return table, {"rows": rows, "borrowed_share": borrowed, "slo": slo, "slo_derivation": slo_note}


ADMISSION_COLS = (("rollout_admitted", "steps admitted"), ("rollout_denied_tpot", "denied: TPOT"),
                  ("rollout_denied_ttft", "denied: TTFT"), ("rollout_denied_kv", "denied: KV"),
                  ("rollout_denied_yielded", "denied: yielding"),
                  ("rollout_returned_unstarted", "turns handed back"),
                  ("rollout_aborted", "turns aborted"), ("rollout_yielded_to_users", "users yielded to"))


def admission_table(summaries: list[dict]) -> Table:
    """Per step, the serving workers' admission: rollout steps admitted and denied by reason,
    turns handed back before they started, turns aborted, users the rollout side yielded to."""
    table = Table(title="Admission on the serving workers (rollout steps; turns; users)",
                  header_style="bold cyan")
    table.add_column("step", justify="right")
    for _, name in ADMISSION_COLS:
        table.add_column(name, justify="right")
    for s in summaries:
        workers = list((s.get("serving") or {}).values())
        table.add_row(str(s["step"]), *[f"{sum(w.get(k) or 0 for w in workers):,}" for k, _ in ADMISSION_COLS])
    return table


def _ms(v) -> str:
    return "n/a" if v is None else f"{1e3 * v:.0f} ms"


def serving_cells(s: dict) -> list[str]:
    """borrowed token share, serving requests, worst worker's P99s, pooled SLO attainment."""
    workers = list((s.get("serving") or {}).values())

    def worst(key: str) -> str:
        vals = [w[key] for w in workers if w.get(key) is not None]
        return f"{1e3 * max(vals):.0f} ms" if vals else "n/a"

    att = s.get("slo_attainment")
    return [f"{s.get('borrowed_share', 0.0):.0%}", f"{s.get('serving_requests', 0):,}",
            worst("ttft_p99_s"), worst("tpot_p99_s"), "n/a" if att is None else f"{att:.1%}"]


class LiveProgress:
    """Listens to flow events and redraws: current step, each phase's state and time."""

    def __init__(self) -> None:
        self.summaries: list[dict] = []
        self.step: int | None = None
        self.phase_state: dict[str, str] = {}
        self.phase_started = 0.0
        self.note = "starting"

    def on_event(self, event: str, data: dict) -> None:
        if event == "run_start":
            self.note = (f"run {data['run']}: from policy version {data['start_version']} "
                         f"to {data['steps']}")
        elif event == "phase_start":
            if data["step"] != self.step:
                self.step, self.phase_state = data["step"], {}
            self.phase_state[data["phase"]] = "running"
            self.phase_started = time.perf_counter()
        elif event == "phase_end":
            self.phase_state[data["phase"]] = f"{data['seconds']:.1f}s"
        elif event == "step_end":
            self.summaries.append(data)

    def render(self) -> Group:
        line = Text(self.note, style="dim")
        phases = Text()
        if self.step is not None:
            phases.append(f"step {self.step}: ", style="bold")
            for name in PHASES:
                state = self.phase_state.get(name, "waiting")
                if state == "running":
                    state = f"running {time.perf_counter() - self.phase_started:.0f}s"
                style = "yellow" if state.startswith("running") else (
                    "dim" if state == "waiting" else "green")
                phases.append(f"{name} [{state}]  ", style=style)
        return Group(line, phases, step_table(self.summaries))


@contextmanager
def live_progress(console: Console | None = None):
    view = LiveProgress()
    unsubscribe = subscribe(view.on_event)
    with Live(view.render(), console=console, refresh_per_second=2,
              get_renderable=view.render, transient=False):
        try:
            yield view
        finally:
            unsubscribe()
