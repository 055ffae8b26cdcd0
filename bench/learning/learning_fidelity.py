"""Does borrowing change learning? Fixed (rollout worker only) vs borrowed (rollout + serving
worker, the serving endpoint under an HTTP replay of the code trace), same seeds, real stack.

    .venv/bin/python -m bench.learning.learning_fidelity [--seeds 3] [--steps 20] [--eval-every 5]

Both modes run on one local stack with 1 rollout + 1 serving worker (started if needed, in the
current ROSE_DATA_DIR); the background replay drives the serving endpoint during both, so the
only difference is whether the scheduler may route turns to the serving worker
(rollout.borrow_serving). Per step: training success, step time, borrowed token share, serving
SLO attainment; every --eval-every steps, held-out success of that step's checkpoint on fixed
maps (bench/learning/heldout.py). Seed noise = the spread of held-out success across seeds within one
mode. Writes bench/results/learning_fidelity.json.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path


from rich.console import Console
from rich.table import Table

from bench.learning.heldout import HeldOut
from core.config import RunConfig

from bench.lib.results import RESULTS, write_json
MODES = ("fixed", "borrowed")


def run_mode(mode: str, seed: int, steps: int, tag: str) -> list[dict]:
    from flows.train import train

    cfg = RunConfig.model_validate({"run_id": f"fidelity-{tag}-{mode}-s{seed}", "seed": seed,
                                    "steps": steps, "stack": {"serving_workers": 1},
                                    "train": {"keep_checkpoints": steps},  # held-out evals
                                    "rollout": {"borrow_serving": mode == "borrowed"}})
    keep = ("step", "success_rate", "step_s", "rollout_s", "train_s", "tokens",
            "borrowed_share", "slo_attainment", "serving_requests")
    return [{k: s.get(k) for k in keep} for s in train(cfg)]


def held_out(mode: str, seed: int, steps: list[int], tag: str, held: HeldOut) -> dict[int, float]:
    import torch

    from storage.checkpoints import load_checkpoint

    run_dir = RunConfig(run_id=f"fidelity-{tag}-{mode}-s{seed}").run_dir()
    out = {}
    for step in steps:
        ckpt = load_checkpoint(run_dir / "checkpoints" / f"step-{step:08d}")
        held.load({n: t.to(torch.bfloat16) for n, t in ckpt.model_state.items()})
        out[step] = held.success()
    return out


def spread(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-maps", type=int, default=64)
    ap.add_argument("--traffic-sample", type=float, default=0.25)
    ap.add_argument("--out", type=Path, default=RESULTS / "learning_fidelity.json")
    args = ap.parse_args()
    console = Console(width=150)
    from rose.launch import ensure_models, ensure_stack
    from replay.background import BackgroundReplay, BackgroundTraffic

    base = RunConfig.model_validate({"stack": {"serving_workers": 1}})
    ensure_models(base, console)
    handle = ensure_stack(base, console)
    if not handle.endpoints:
        raise SystemExit("the stack has no serving endpoint: `rose down`, then run again "
                         "(or `rose up --serving-workers 1`)")
    tag, t0 = time.strftime("%H%M%S"), time.perf_counter()
    eval_steps = sorted({*range(args.eval_every, args.steps + 1, args.eval_every), args.steps})
    runs: dict[str, dict[int, dict]] = {m: {} for m in MODES}
    traffic = BackgroundTraffic(sample=args.traffic_sample)
    # enough trace for every run at ~20 s a step (the replay plays the trace again if needed)
    traffic = replace(traffic, window_s=args.seeds * len(MODES) * args.steps * 20 / traffic.time_scale)
    with BackgroundReplay(list(handle.endpoints.values()), traffic) as users:
        for seed in range(args.seeds):
            for mode in MODES:
                runs[mode][seed] = {"steps": run_mode(mode, seed, args.steps, tag)}
                console.print(f"{mode} seed {seed}: done ({time.perf_counter() - t0:.0f} s)")
                write(args.out, {"partial": True, "tag": tag, "runs": runs})  # a crash keeps them
    served = users.summary
    with HeldOut(base, args.eval_maps) as held:
        initial = held.success()
        for mode in MODES:
            for seed in range(args.seeds):
                runs[mode][seed]["held_out"] = held_out(mode, seed, eval_steps, tag, held)
    report = summarize(runs, eval_steps, initial)
    report.update(args=vars(args) | {"out": str(args.out)}, serving_users=served,
                  total_s=time.perf_counter() - t0, runs=runs)
    print_table(console, report)
    write(args.out, {"tag": tag, **report})
    console.print(f"results: {args.out}")


def write(path: Path, report: dict) -> None:
    write_json(path, report, default=str)


def summarize(runs: dict, eval_steps: list[int], initial: float) -> dict:
    curves = {}
    for mode in MODES:
        seeds = runs[mode].values()
        curves[mode] = {
            "held_out": {s: statistics.fmean(r["held_out"][s] for r in seeds) for s in eval_steps},
            "held_out_seed_sd": {s: spread([r["held_out"][s] for r in seeds]) for s in eval_steps},
            # step 1 pays engine warm-up on both modes: steady state from step 2
            "step_s": statistics.fmean(p["step_s"] for r in seeds for p in r["steps"][1:] or r["steps"]),
            "rollout_s": statistics.fmean(p["rollout_s"] for r in seeds
                                          for p in r["steps"][1:] or r["steps"]),
            "borrowed_share": statistics.fmean(p["borrowed_share"] or 0 for r in seeds
                                               for p in r["steps"]),
        }
    last = eval_steps[-1]
    gap = abs(curves["fixed"]["held_out"][last] - curves["borrowed"]["held_out"][last])
    noise = max(curves[m]["held_out_seed_sd"][last] for m in MODES)
    return {"initial_held_out": initial, "eval_steps": eval_steps, "curves": curves,
            "final_gap": gap, "seed_sd": noise, "within_noise": gap <= 2 * noise,
            "speedup": curves["fixed"]["step_s"] / curves["borrowed"]["step_s"],
            "rollout_speedup": curves["fixed"]["rollout_s"] / curves["borrowed"]["rollout_s"]}


def print_table(console: Console, r: dict) -> None:
    table = Table(title="Learning fidelity: held-out success (mean over seeds, ± seed sd)",
                  header_style="bold cyan")
    table.add_column("step", justify="right")
    for mode in MODES:
        table.add_column(mode, justify="right")
    table.add_row("0", *[f"{r['initial_held_out']:.1%}"] * 2)
    for s in r["eval_steps"]:
        table.add_row(str(s), *[f"{r['curves'][m]['held_out'][s]:.1%} ± "
                                f"{r['curves'][m]['held_out_seed_sd'][s]:.1%}" for m in MODES])
    for key, fmt in (("step_s", "{:.2f} s"), ("rollout_s", "{:.2f} s"), ("borrowed_share", "{:.0%}")):
        table.add_row(key, *[fmt.format(r["curves"][m][key]) for m in MODES])
    console.print(table)
    su = r["serving_users"]
    console.print(f"step time fixed/borrowed: {r['speedup']:.2f}x (rollout phase "
                  f"{r['rollout_speedup']:.2f}x); final held-out gap {r['final_gap']:.1%} vs seed "
                  f"sd {r['seed_sd']:.1%}: {'within' if r['within_noise'] else 'OUTSIDE'} 2 sd; "
                  f"serving users: {su['requests']} requests, {su['errors']} failed, TTFT p99 "
                  f"{su['ttft_p99_s']} s")


if __name__ == "__main__":
    main()
