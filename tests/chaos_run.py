"""One chaos fault's run: a short training run on a local stack (fresh, or one already up)
while the fault strikes from outside the product, and its row: what the run left behind
(tests/chaos_stack.py), the serving users' view (tests/chaos_serving.py), the run's own step
summaries. Used by the chaos bench (bench/stack/chaos.py) and its quick faults' tests (tests/test_chaos.py).
"""
from __future__ import annotations

from contextlib import nullcontext
import json
import threading
import time
import traceback
from pathlib import Path

from rich.console import Console

from tests.chaos_faults import Fault
from tests.chaos_serving import ServingLoad
from tests.chaos_stack import Bed, Progress, dataset_check, weights_check

USERS_AFTER_S = 10.0  # the replay's users stay this long after a serving fault is over


def run_config(args, stack: dict, steps: int | None = None) -> dict:
    return {"steps": steps or args.steps, "seed": 7,
            "stack": {"relay": "mooncake", **stack},
            "rollout": {"groups": args.groups, "group_size": args.group_size,
                        "max_turns": args.max_turns, "max_concurrency_per_worker": 8}}


def run_fault(fault: Fault, args, console: Console, stack: Bed | None = None) -> dict:
    """One fault's row. `stack`: a bed already up with the fault's stack, run on (its own run)
    and left up, instead of a fresh stack brought up and down around the run."""
    config = run_config(args, fault.stack, fault.steps)
    bed = stack.run_on(f"f{fault.key}", config) if stack is not None \
        else Bed.fresh(Path(args.root), f"f{fault.key}", Path(args.models), config)
    steps = bed.config["steps"]
    row: dict = {"fault": fault.key, "title": fault.title, "where": fault.where, "steps": steps,
                 "deadline_s": fault.deadline_s, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                     time.gmtime())}
    record: dict = {}
    progress = Progress(bed)
    try:
        console.print(f"[bold]fault {fault.key}[/]: {fault.title} ({bed.data})")
        if stack is None:
            bed.up()
        progress.start()
        injector = threading.Thread(target=_strike, args=(fault, bed, progress, record),
                                    daemon=True)
        injector.start()
        with ServingLoad(bed) if fault.serving else nullcontext() as load:
            out = bed.rose(["train", "-c", str(bed.config_file), "--run-id", bed.run_id],
                           fault.deadline_s)
            if load is not None:  # the users stay until the fault is over (its endpoint
                injector.join(300)  # answers again, timed by the fault) and a bit after
                time.sleep(USERS_AFTER_S)
        if load is not None:
            row.update(load.report(record.get("at")))
        if fault.after is not None:
            out = fault.after(bed, out, record)
        injector.join(30)
        row.update(rc=out.rc, hung=out.hung, run_s=round(out.seconds, 1), tail=out.tail(300))
    except Exception as e:  # noqa: BLE001 - a harness failure is a row too
        row.update(rc=None, hung=False, error=f"{type(e).__name__}: {e}",
                   tail=traceback.format_exc()[-600:])
    finally:
        progress.stop()
        if bed.keep is not None:
            bed.keep.close()
        if stack is None:
            row["down_rc"] = bed.down().rc
    row["injected"] = record
    row["recover_s"] = None if progress.recovered_s is None else round(progress.recovered_s, 1)
    row.update(dataset_check(bed))
    row.update(_summary(bed))
    try:
        row.update(weights_check(bed))
    except Exception as e:  # noqa: BLE001
        row.update(weights_equal=None, weights_error=f"{type(e).__name__}: {e}")
    after = record.get("serving_after") or {}
    if after.get("digest"):  # the restarted serving worker re-attached and pulled the run's weights
        row["serving_holds_final"] = (after.get("version") == steps
                                      and after["digest"] == row.get("final_digest"))
    row["recovered"] = bool(row.get("rc") == 0 and record and not record.get("error")
                            and row.get("final_checkpoint") == steps
                            and row["trajectories_lost"] == 0 and row["duplicate_rows"] == 0)
    return row


def _strike(fault: Fault, bed: Bed, progress: Progress, record: dict) -> None:
    try:
        fault.inject(bed, progress, record)
    except Exception as e:  # noqa: BLE001 - the row says the fault never struck
        record["error"] = f"{type(e).__name__}: {e}"
        record["error_trace"] = traceback.format_exc()[-800:]


def _summary(bed: Bed) -> dict:
    """Rerouted turns and dead workers as the run's own step summaries report them."""
    try:
        steps = json.loads((bed.run_dir / "summary.json").read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return {}
    return {"rerouted_turns": sum(s.get("rerouted_turns") or 0 for s in steps),
            "dead_workers": sorted({w for s in steps for w in s.get("dead_workers") or ()}),
            "publish_left_out": {w: why for s in steps
                                 for w, why in (s.get("publish_left_out") or {}).items()},
            "phases_reused": {s["step"]: [p for p, st in (s.get("phase_states") or {}).items()
                                          if st == "Cached"] for s in steps},
            "rejoined_workers": sorted({w for s in steps
                                        for w in s.get("rejoined_workers") or ()}),
            # the endpoint's own records (request received -> tokens): what admission controls,
            # apart from the flood client's time to open its connections on the same cores
            "serving_engine": {s["step"]: {w: {k: v.get(k) for k in (
                "requests", "failed", "ttft_p99_s", "tpot_p99_s", "slo_attainment")}
                for w, v in (s.get("serving") or {}).items()} for s in steps}}
