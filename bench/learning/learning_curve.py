"""GRPO learning curve without the stack: the same Episode, reward and Trainer code as the flow,
one in-process vLLM engine, weights reloaded in place after every update. A step takes ~1-2 s
here instead of ~10 s on the stack, so learning rates and batch shapes can be compared quickly.

    .venv/bin/python -m bench.learning.learning_curve --steps 40 --lr 5e-4 2e-5
    .venv/bin/python -m bench.learning.learning_curve --steps 40 --set rollout.groups=8 --set train.updates_per_step=2

Every `--eval-every` steps the policy plays a fixed set of held-out maps (seeds 10^6..), one
episode each at temperature 1: the same maps for every configuration, unlike the training
maps, which change every step. Results: bench/results/learning_curve.json.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench.lib.results import RESULTS, write_json

from bench.learning.heldout import HeldOut


def parse_set(items: list[str]) -> dict:
    """["train.lr=1e-4", "rollout.groups=8"] -> {"train": {"lr": 1e-4}, "rollout": {"groups": 8}}"""
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"--set {item!r}: expected section.key=value, e.g. train.lr=1e-4")
        section, name = key.split(".", 1)
        try:
            parsed = json.loads(value)  # numbers, true/false, lists
        except json.JSONDecodeError:
            parsed = value  # a bare string, e.g. rollout.env=guess
        out.setdefault(section, {})[name] = parsed
    return out


def curve(overrides: dict, steps: int, eval_every: int, eval_maps: int, policy: Path) -> dict:
    import pyarrow as pa

    from executors.workers.trainer import Trainer
    from core.config import RunConfig
    from tasks.reward import advantages_by_trajectory
    from tasks.rollout import env_seed

    cfg = RunConfig.model_validate({**overrides, "run_id": "learning-curve",
                                    "models": {"policy_dir": str(policy)}})
    r = cfg.rollout
    held = HeldOut(cfg, eval_maps)
    trainer = Trainer(cfg)  # the run dir is a fresh temp data dir: no checkpoint to resume

    def success(episodes) -> float:
        return sum(ep.succeeded for ep in episodes) / len(episodes)

    points = [{"step": 0, "eval_success": held.success()}]
    try:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            episodes = held.play(step, r.groups, r.group_size, lambda g: env_seed(cfg.seed, step, g))
            rows = [row for ep in episodes for row in ep.rows]
            adv = advantages_by_trajectory(rows)
            table = pa.Table.from_pylist([{"trajectory": row["trajectory"], "turn": row["turn"],
                                           "prompt_ids": row["prompt_ids"],
                                           "response_ids": row["response_ids"],
                                           "advantage": adv[row["trajectory"]]} for row in rows])
            stats = trainer.train_step(table)
            held.load(trainer.weights_bf16())
            point = {"step": step, "train_success": success(episodes),
                     "grad_norm": stats.get("grad_norm", 0.0), "step_s": time.perf_counter() - t0}
            if step % eval_every == 0 or step == steps:
                point["eval_success"] = held.success()
            points.append(point)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in point.items()}), flush=True)
    finally:
        held.loop.close()
    return {"overrides": overrides, "config": json.loads(cfg.model_dump_json()), "points": points}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, nargs="*", default=[], help="one curve per value")
    ap.add_argument("--set", action="append", default=[], help="section.key=value (RunConfig)")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-maps", type=int, default=256)
    ap.add_argument("--policy", type=Path, default=None, help="default: <data dir>/models/policy")
    ap.add_argument("--out", type=Path, default=RESULTS / "learning_curve.json")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from core.config import data_dir

    policy = (args.policy or data_dir() / "models" / "policy").resolve()
    if not (policy / "config.json").is_file():
        raise SystemExit(f"no policy model in {policy}: run `rose models build` first")
    base = parse_set(args.set)
    runs = []
    for lr in args.lr or [None]:
        overrides = json.loads(json.dumps(base))
        if lr is not None:
            overrides.setdefault("train", {})["lr"] = lr
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["ROSE_DATA_DIR"] = tmp  # checkpoints of this throwaway run
            runs.append(curve(overrides, args.steps, args.eval_every, args.eval_maps, policy))
    table = Table(title=f"held-out success ({args.eval_maps} fixed maps, temperature 1)")
    table.add_column("configuration")
    evals = [p["step"] for p in runs[0]["points"] if "eval_success" in p]
    for s in evals:
        table.add_column(f"step {s}", justify="right")
    for run in runs:
        by_step = {p["step"]: p["eval_success"] for p in run["points"] if "eval_success" in p}
        table.add_row(json.dumps(run["overrides"]) or "defaults",
                      *[f"{by_step.get(s, float('nan')):.3f}" for s in evals])
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, {"bench": "learning_curve", "policy": str(policy),
                                    "eval_maps": args.eval_maps, "runs": runs})


if __name__ == "__main__":
    main()
