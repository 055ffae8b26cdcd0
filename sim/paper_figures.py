"""The ROSE paper's figures at the paper's scale, simulated (sim/), beside the paper's numbers.

Run by `python -m bench.sim.paper_figures` (bench/sim/paper_figures.py: parser()'s options; it
prints the report and writes bench/results/paper_figures.json with one PNG per figure beside it)
and by the `paper-figures` deployment (flows/paper_figures.py: each simulation one Prefect task on
Dask workers, through runner()); write_figures() gives both the same rows and the same JSON.

Workload: sim/profiles/workload_paper_qwen3_8b_frozenlake.json (sim/paper_workloads.py: every
parameter cited or marked chosen); --fit first refits its two fitted parameters (response median
to the 77% prefill-token share, turn median to 607 s of rollout at 8 rollout GPUs) and rewrites it.
Fleet: the H100 profiles (the H800's chip) with the long-context engine terms (sim/engine_cost.py).
Setting (paper §6): 16 GPUs, (rollout, train) = (8, 8), 256 trajectories a step (32 per rollout
GPU), 16 per rollout GPU at once, borrowed serving GPUs capped at 16. The serving SLO is 2x the
P99 of serving alone (the fixed configuration), as every sweep here sets it. The trainer is charged
for each trajectory's final sequence once, the paper's reading (PAPER_TRAIN_TOKENS), as for 32B.

The figures:
- Fig. 1 (characterization): rollout share of the step, P75 trajectory / rollout time, prefill
  share, rollout seconds at 8 and 16 rollout GPUs;
- Fig. 7a (GRPO, 8B): step throughput of the resource-fixed system (serving GPUs only serve;
  with ROSE's turn-wise routing, and with trajectories pinned to a GPU), ROSE, SLO-unaware
  co-location, a static partition and an AReaL-style asynchronous system (the fixed GPUs with
  generation one step ahead of training); the paper's ratio ranges beside; and under DAPO's
  redundant sampling (sim/redundant_sampling.py) at three valid-group shares;
- Table 3: the routing ablation against the paper's baseline, each trajectory pinned to a dedicated
  rollout GPU (table3_modes; pinned on any worker, borrowed ones included, beside it), turn-wise,
  + KV affinity, and the router's decision time P99 (the paper: under 10 ms);
- Fig. 14 / App. E: rollout seconds against the serving-GPU quota 0/4/8/16;
- sensitivity: ROSE / fixed against the two parameters the paper does not give that move the
  tail most (the trajectory-level response spread and the environment's seconds per step), and
  Fig. 1b's tail shape: two modes of trajectory level against the fitted single one (tail_shapes).
- Qwen3-32B on ALFWorld (sim/paper_figures_32b.py, TP-4 engines, 64 serving GPUs at most): Fig. 1's
  statistics and Fig. 7a-c's rows (`--only-32b`: these alone, into the existing JSON; `--no-32b`: the
  rest, keeping the existing JSON's 32B rows).
The paper's extracted text lost some numbers (the Fig. 14 reductions, Table 3's factor): those
columns say so.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.fleet import sweep_settings
from sim.paper_numbers import PAPER
from sim.paper_report import pct, report, report_32b
from sim.paper_workloads import (PAPER_TRAIN_TOKENS, QWEN3_8B_FROZENLAKE, PaperWorkload,
                                 fit_response_median, fit_turns_median, prefill_share)
from sim.profiles import PROFILE_DIR
from sim.report import speedup
from sim.timed_run import simulate
from sim.workload import WorkloadSpec
from storage.cores import available_cores

WORKLOAD = "workload_paper_qwen3_8b_frozenlake"
ALLOCATIONS_S = (30.0, 60.0, 120.0)  # chosen: an elastic instance's start + weight load per step (not published)


FIGURES = ("fig1", "fig7a", "dapo", "sensitivity", "scale", "32b")  # --figures
WriteJson = Callable[[Path, dict], None]  # a JSON document to its path (the bench's writer, the flow's)


class Job(NamedTuple):
    cfg: SimConfig
    spec: WorkloadSpec | None
    label: str
    own_slo: bool


def base_config(args, **kw) -> SimConfig:
    """The paper's 8B setting (the module's docstring), with `kw` changed."""
    base = SimConfig(gpus=16, steps=args.steps, seed=args.seed, workload=args.workload, serving_ratio=2.0,
                     traj_per_rollout_gpu=32, cap_per_rollout_gpu=16, serving_max_turns=16,
                     train_tokens=PAPER_TRAIN_TOKENS, **sweep_settings(args.fleet, None))
    return replace(base, **kw)


def job(cfg: SimConfig, spec: WorkloadSpec | None = None, label: str = "", own_slo: bool = False) -> Job:
    """One simulation to run: with own_slo (a fixed configuration), judged at the SLO it sets
    (sim/timed_run.py)."""
    return Job(cfg, spec, label, own_slo)


def runs(jobs: dict[str, Job]) -> dict[str, dict]:
    """Simulations that do not depend on each other, by name: here one after another, or all at
    once where a runner is set (flows/paper_figures.py: one Prefect task each on Dask workers)."""
    out = (_runner or _one_by_one)(jobs)
    for name, j in jobs.items():
        r = out[name]
        tps = "unfinished" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f} tok/s"
        print(f"  {j.label or j.cfg.config:<34} {tps:>16}  rollout {r['rollout_s_mean']:6.0f} s  "
              f"borrowed {r['borrowed_share']:4.0%}  SLO {pct(r['slo_attainment'])}  ({r['wall_s']:.1f} s)",
              flush=True)
    return out


def run(cfg: SimConfig, spec: WorkloadSpec | None = None, label: str = "", own_slo: bool = False) -> dict:
    """One simulation (runs() of one job)."""
    return runs({"run": job(cfg, spec, label, own_slo)})["run"]


def _one_by_one(jobs: dict[str, Job]) -> dict[str, dict]:
    return {name: simulate(j.cfg, j.spec, j.own_slo) for name, j in jobs.items()}


_runner: Callable[[dict[str, Job]], dict[str, dict]] | None = None


@contextmanager
def runner(fn: Callable[[dict[str, Job]], dict[str, dict]]) -> Iterator[None]:
    """Run every batch of simulations through `fn` (jobs by name -> results by name) meanwhile."""
    global _runner
    before, _runner = _runner, fn
    try:
        yield
    finally:
        _runner = before


def slo_of(fixed: dict) -> dict:
    """The SLO a fixed run judged at its own (run(..., own_slo=True)) set, as SimConfig fields."""
    return dict(slo_ttft_s=fixed["slo_ttft_s"], slo_tpot_s=fixed["slo_tpot_s"])


def characterization(args) -> dict:
    spec = WorkloadSpec.load(PROFILE_DIR / f"{args.workload}.json")
    r = runs({"8": job(base_config(args, config="fixed", serving_ratio=0.0), label="fixed, 8 rollout GPUs"),
              "16": job(base_config(args, config="fixed", serving_ratio=0.0, gpus=32, traj_per_rollout_gpu=16),
                        label="fixed, 16 rollout GPUs")})
    r8, r16 = r["8"], r["16"]
    return {"rollout_share": r8["rollout_share"], "p75_share": r8["trajectory_p75_share"],
            "prefill_share": prefill_share(spec), "rollout_s_8": r8["rollout_s_mean"],
            "rollout_s_16": r16["rollout_s_mean"], "preempted": r8["preempted"]}


def end_to_end(args) -> tuple[dict, dict]:
    fixed = run(base_config(args, config="fixed"), label="resource-fixed, turn-wise routing", own_slo=True)
    slo = slo_of(fixed)  # serving alone sets the SLO
    # tail batching's long round comes every 1 / tail_share rounds: 4 steps hold 3 short and 1 long
    long_steps = max(4, args.steps)
    jobs = {"fixed_pinned": job(base_config(args, config="fixed", mode="pinned", **slo),
                                label="resource-fixed, pinned trajectories"),
            "rose": job(base_config(args, config="rose", **slo), label="ROSE"),
            "slo_unaware": job(base_config(args, config="slo_unaware", **slo), label="SLO-unaware co-location"),
            "static": job(base_config(args, config="static", **slo), label="static partition"),
            # AReaL-style: the same fixed GPUs, generation asynchronous to training with staleness 1
            # (the next step's rollout overlaps this step's train and publish: SimConfig.off_policy)
            "areal_style": job(base_config(args, config="fixed", off_policy=1, **slo),
                               label="AReaL-style asynchronous (staleness 1)"),
            "rose_off_policy": job(base_config(args, config="rose", off_policy=1, **slo),
                                   label="ROSE, one-step off-policy"),
            # the most 16 more GPUs could add: external, dedicated, there from the step's start
            "elastic_free": job(base_config(args, config="elastic", elastic_alloc_s=0.0, **slo),
                                label="16 external GPUs, no allocation")}
    for alloc in ALLOCATIONS_S:
        jobs[f"elastic_{alloc:g}s"] = job(base_config(args, config="elastic", elastic_alloc_s=alloc, **slo),
                                          label=f"resource-elastic, {alloc:g} s allocation")
    jobs |= {"fixed_4_steps": job(base_config(args, config="fixed", steps=long_steps, **slo), label="fixed, 4 steps"),
             "rollpacker": job(base_config(args, config="fixed", tail_batching=True, steps=long_steps, **slo),
                               label="RollPacker tail batching (4 steps)"),
             "rollpacker_rose": job(base_config(args, config="rose", tail_batching=True, steps=long_steps, **slo),
                                    label="RollPacker + ROSE (4 steps)")}
    jobs |= {f"table3_{mode}": job(base_config(args, config="rose", mode=mode, **slo), label=f"ROSE, {mode}")
             for mode in ("pinned", "turnwise")}
    done = runs(jobs)
    rows = {"fixed": fixed} | {k: v for k, v in done.items() if not k.startswith("table3_")}
    for name, r in rows.items():
        r["vs_fixed"] = speedup(r, rows["fixed_4_steps"] if name.startswith("rollpacker") else fixed)
        r["vs_fixed_pinned"] = speedup(r, rows["fixed_pinned"])
    return rows, table3_modes(rows["fixed_pinned"], done["table3_pinned"], done["table3_turnwise"], rows["rose"])


def table3_modes(pinned: dict, pinned_borrowing: dict, turnwise: dict, affinity: dict) -> dict:
    """Table 3's rows, its baseline first. The paper's baseline ('we pin each trajectory to a fixed
    rollout worker for its entire lifetime', §6.4) is read as a dedicated rollout worker: with the
    routing heuristics off no turn spills to a serving GPU, since offloading the excess is part of
    turn-wise routing (§4.3). Pinned on any worker, borrowed serving GPUs included, is shown too."""
    return {"pinned": pinned, "pinned_borrowing": pinned_borrowing, "turnwise": turnwise,
            "turnwise_affinity": affinity}


def dapo(args) -> list[dict]:
    """Fig. 7 under DAPO: the resource-fixed system and ROSE at a few valid-group shares (the
    paper gives none), each with its own SLO from serving alone."""
    shares = (0.3, 0.5, 0.8)
    kw = {share: dict(algorithm="dapo", dapo_valid_rate=share) for share in shares}
    fixed = runs({str(share): job(base_config(args, config="fixed", **kw[share]),
                                  label=f"DAPO {share:.0%} valid: fixed", own_slo=True) for share in shares})
    rose = runs({str(share): job(base_config(args, config="rose", **kw[share], **slo_of(fixed[str(share)])),
                                 label=f"DAPO {share:.0%} valid: ROSE") for share in shares})
    rows = []
    for share in shares:
        f, r = fixed[str(share)], rose[str(share)]
        rows.append({"valid_share": share, "fixed": f, "rose": r, "rose_vs_fixed": speedup(r, f),
                     "launched_per_step": f["trajectories_started"] / max(1, f["steps"])})
    return rows


def quota(args, slo: dict) -> dict:
    out = runs({str(n): job(base_config(args, config="rose", serving_ratio=n / 8, **slo),
                            label=f"ROSE, {n} serving GPUs") for n in (4, 8, 16)})
    return {int(n): r for n, r in out.items()}


def sensitivity(args) -> list[dict]:
    """The fitted workload with one unpublished parameter changed at a time (the others fitted)."""
    fitted = PaperWorkload.load(args.workload.removeprefix("workload_paper_"))
    points = [(sigma, env_s) for sigma in (0.8, 1.6, 2.4) for env_s in (0.2, 2.0)]
    specs = {p: replace(fitted, trajectory_sigma=p[0], env_s=p[1]).spec() for p in points}
    fixed = runs({str(p): job(base_config(args, config="fixed"), specs[p], f"fixed, sigma {p[0]}, env {p[1]} s",
                              own_slo=True) for p in points})
    rose = runs({str(p): job(base_config(args, config="rose", **slo_of(fixed[str(p)])), specs[p],
                             f"ROSE, sigma {p[0]}, env {p[1]} s") for p in points})
    rows = []
    for (sigma, env_s) in points:
        f, r = fixed[str((sigma, env_s))], rose[str((sigma, env_s))]
        rows.append({"trajectory_sigma": sigma, "env_s": env_s, "fixed_rollout_s": f["rollout_s_mean"],
                     "rose_rollout_s": r["rollout_s_mean"], "rose_vs_fixed": speedup(r, f),
                     "borrowed_share": r["borrowed_share"], "slo_attainment": r["slo_attainment"]})
    return rows


# Fig. 1b's shapes tried (chosen: the paper publishes no distribution): (share of trajectories in
# the long mode, their level against the others'), each mode log-normal with sigma TAIL_MODE_SIGMA
TAIL_SHAPES = ((0.1, 100.0), (0.2, 20.0), (0.25, 40.0))
TAIL_MODE_SIGMA = 0.3


def tail_shapes(args) -> list[dict]:
    """Fig. 1b against Fig. 1c and ROSE / fixed: the fitted workload (one log-normal level per
    trajectory) and two-mode levels (most trajectories short, a share long), each with its response
    median refitted to the published prefill share; per shape the 8- and 16-GPU fixed rollouts
    (Fig. 1's setting), and the fixed system and ROSE at the figures' setting."""
    fitted = PaperWorkload.load(args.workload.removeprefix("workload_paper_"))
    shapes = {"one mode": fitted} | {
        f"{share:.0%} at {level:g}x": fit_response_median(
            replace(fitted, long_share=share, long_level=level, trajectory_sigma=TAIL_MODE_SIGMA),
            PAPER["prefill_share"][0]) for share, level in TAIL_SHAPES}
    specs = {name: w.spec() for name, w in shapes.items()}
    alone = dict(config="fixed", serving_ratio=0.0)
    first = runs({f"{name}|{kind}": job(base_config(args, **kw), specs[name], f"{kind}, tail {name}",
                                        own_slo=kind == "fixed")
                  for name in shapes for kind, kw in (("fixed 8", alone), ("fixed", dict(config="fixed")),
                                                       ("fixed 16", alone | dict(gpus=32, traj_per_rollout_gpu=16)))})
    rose = runs({name: job(base_config(args, config="rose", **slo_of(first[f"{name}|fixed"])), specs[name],
                           f"ROSE, tail {name}") for name in shapes})
    rows = []
    for name, w in shapes.items():
        r8, r16, fixed, r = (first[f"{name}|fixed 8"], first[f"{name}|fixed 16"], first[f"{name}|fixed"], rose[name])
        traj = [s["trajectory_s"] for s in r8["per_step"] if s.get("trajectory_s")]
        rows.append({"shape": name, "long_share": w.long_share, "long_level": w.long_level,
                     "trajectory_sigma": w.trajectory_sigma, "response_median": w.response_median,
                     "prefill_share": prefill_share(specs[name]), "p75_share": r8["trajectory_p75_share"],
                     "p75_s": sum(t["p75"] for t in traj) / len(traj), "max_s": sum(t["max"] for t in traj) / len(traj),
                     "rollout_s_8": r8["rollout_s_mean"], "rollout_s_16": r16["rollout_s_mean"],
                     "rose_vs_fixed": speedup(r, fixed), "borrowed_share": r["borrowed_share"],
                     "rose_slo_attainment": r["slo_attainment"]})
    return rows


def concurrency(args, e2e: dict, slo: dict) -> list[dict]:
    """ROSE / fixed against the trajectories each GPU runs at once (router cap, also the serving GPUs'
    turn cap): the paper does not say how many ROLL runs; 16 is the figures' setting."""
    jobs = {}
    for cap in (8, 32):
        kw = dict(cap_per_rollout_gpu=cap, serving_max_turns=cap, **slo)
        jobs |= {f"fixed_{cap}": job(base_config(args, config="fixed", **kw), label=f"fixed, {cap} at once"),
                 f"rose_{cap}": job(base_config(args, config="rose", **kw), label=f"ROSE, {cap} at once"),
                 f"elastic_free_{cap}": job(base_config(args, config="elastic", elastic_alloc_s=0.0, **kw),
                                            label=f"16 external GPUs, {cap} at once")}
    done, rows = runs(jobs), []
    for cap in (8, 16, 32):
        r = {k: e2e[k] if cap == 16 else done[f"{k}_{cap}"] for k in ("fixed", "rose", "elastic_free")}
        rows.append({"cap": cap, **{f"{k}_tokens_per_s": v["tokens_per_s"] for k, v in r.items()},
                     "rose_vs_fixed": speedup(r["rose"], r["fixed"]),
                     "elastic_free_vs_fixed": speedup(r["elastic_free"], r["fixed"]),
                     "rose_borrowed_share": r["rose"]["borrowed_share"],
                     "fixed_rollout_s": r["fixed"]["rollout_s_mean"],
                     "rose_slo_attainment": r["rose"]["slo_attainment"]})
    return rows


def train_token_models(args, e2e: dict) -> dict:
    """Fig. 1's statistics and ROSE / fixed with the trainer charged each way (SimConfig.train_tokens):
    the figures' final sequences (Fig. 7a's rows) and every turn's whole context."""
    every = dict(train_tokens="every_turn")
    fixed = run(base_config(args, config="fixed", **every), label="fixed, every turn trained", own_slo=True)
    rose = run(base_config(args, config="rose", **every, **slo_of(fixed)), label="ROSE, every turn trained")
    return {PAPER_TRAIN_TOKENS: train_row(e2e["fixed"], e2e["rose"]), "every_turn": train_row(fixed, rose)}


def train_row(fixed: dict, rose: dict) -> dict:
    """Fig. 1's statistics and ROSE / fixed under one SimConfig.train_tokens setting."""
    train_s = sum(x["train_s"] for x in fixed["per_step"]) / max(1, len(fixed["per_step"]))
    return {"rollout_share": fixed["rollout_share"], "p75_share": fixed["trajectory_p75_share"],
            "train_s": train_s, "fixed_tokens_per_s": fixed["tokens_per_s"], "rose_vs_fixed": speedup(rose, fixed),
            "fixed_rollout_s": fixed["rollout_s_mean"], "rose_rollout_s": rose["rollout_s_mean"],
            "rose_slo_attainment": rose["slo_attainment"]}


def scale(args, slo: dict) -> dict:
    """The event-jumping engine against the per-iteration one at 16 GPUs (one step of ROSE), and
    ROSE at 1,024 GPUs x 5 steps: wall and CPU seconds (the machine is shared: CPU is what the
    simulator costs, wall what this run took)."""
    return runs({"per_iteration": job(base_config(args, config="rose", steps=1, event_jump=False, **slo),
                                      label="ROSE 16 GPUs, per-iteration engine"),
                 "jump": job(base_config(args, config="rose", steps=1, event_jump=True, **slo),
                             label="ROSE 16 GPUs, event jumping"),
                 "large": job(base_config(args, config="rose", gpus=args.scale_gpus, steps=5, **slo),
                              label=f"ROSE {args.scale_gpus} GPUs x 5 steps")})


def fit(args) -> None:
    def rollout_of(spec: WorkloadSpec) -> float:
        return ClusterSim(base_config(args, config="fixed", serving_ratio=0.0), workload=spec).run()["rollout_s_mean"]
    w = fit_turns_median(QWEN3_8B_FROZENLAKE, PAPER["prefill_share"][0], PAPER["rollout_s_8"][0], rollout_of)
    path = w.write()
    print(f"fitted: turns median {w.turns_median}, response median {w.response_median} -> {path}")


def parser(out: Path | None = None) -> argparse.ArgumentParser:
    """The figures' options (`python -m bench.sim.paper_figures --help`); `out`: --out's default."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fleet", default="h100_qwen3_8b")
    ap.add_argument("--workload", default=WORKLOAD)
    ap.add_argument("--fit", action="store_true", help="refit the workload's two fitted parameters first")
    ap.add_argument("--no-sensitivity", action="store_true")
    ap.add_argument("--no-scale", action="store_true", help="skip the 1,024-GPU timing run")
    ap.add_argument("--scale-gpus", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--no-32b", action="store_true", help="skip the Qwen3-32B / ALFWorld rows")
    ap.add_argument("--only-32b", action="store_true", help="only the 32B rows, into the existing JSON")
    ap.add_argument("--figures", nargs="+", choices=FIGURES, default=list(FIGURES),
                    help="which figures to run (fig7a: with Table 3, Fig. 14 and concurrency; scale needs fig7a)")
    return ap


def write_figures(args: argparse.Namespace, write: WriteJson) -> dict:
    """Run the figures `args` asks for, print them and write their JSON document to args.out
    through `write`; their fields (with --only-32b, the 32B rows)."""
    t0 = time.perf_counter()
    if args.only_32b:
        return only_32b(args, t0, write)
    if args.fit:
        fit(args)
    fields = figures(args, t0)
    if not fields["qwen3_32b"] and args.out.is_file():  # --no-32b: the 32B rows already written stay
        fields["qwen3_32b"] = json.loads(args.out.read_text()).get("qwen3_32b", {})
    print(report(fields))
    write(args.out, document(args, t0, fields))
    return fields


def document(args: argparse.Namespace, started: float, fields: dict) -> dict:
    """The figures' JSON: the header every bench's result starts with (bench/lib/results.py's
    write_result: what ran, where and for how long), then `fields`."""
    return {"bench": "paper_figures", "machine": platform.platform(), "cpus": available_cores(),
            "seconds": time.perf_counter() - started,
            "args": {k: str(v) for k, v in vars(args).items()}, **fields}


def figures(args, t0: float) -> dict:
    """Every figure's simulations, batch by batch (runs()), and the rows main writes."""
    off = {"sensitivity": args.no_sensitivity, "scale": args.no_scale, "32b": args.no_32b}
    want = {f for f in args.figures if not off.get(f)}
    fig1 = (print("Fig. 1: characterization") or characterization(args)) if "fig1" in want else {}
    e2e, table3, fig14, fig7_dapo, sens, shapes, conc, big = {}, {}, {}, [], [], [], [], {}
    if "fig7a" in want:
        print("Fig. 7a / Table 3: GRPO, Qwen3-8B, 16 GPUs + up to 16 serving GPUs")
        e2e, table3 = end_to_end(args)
        print("Fig. 14: serving-GPU quota")
        fig14 = {0: e2e["fixed"]} | quota(args, slo_of(e2e["fixed"]))
    if "dapo" in want:
        print("Fig. 7 under DAPO (redundant sampling)")
        fig7_dapo = dapo(args)
    if "sensitivity" in want:
        print("Sensitivity")
        sens = sensitivity(args)
        print("Fig. 1b's tail shape")
        shapes = tail_shapes(args)
    if e2e:
        print("Concurrency: trajectories per GPU at once")
        conc = concurrency(args, e2e, slo_of(e2e["fixed"]))
    if e2e:
        print("The trainer charged every turn's whole context")
        fig1 = fig1 and fig1 | {"train_tokens": train_token_models(args, e2e)}
    if e2e and "scale" in want:
        print("Scale: event jumping")
        big = scale(args, slo_of(e2e["fixed"]))
    t32 = time.perf_counter()
    q32 = (print("Qwen3-32B on ALFWorld") or figures_32b(args)) if "32b" in want else {}
    q32 = q32 and q32 | {"total_s": time.perf_counter() - t32}
    return dict(paper=PAPER, fig1=fig1, fig7a=e2e, fig7_dapo=fig7_dapo, table3=table3, fig14=fig14,
                sensitivity=sens, tail_shapes=shapes, concurrency=conc, scale=big, qwen3_32b=q32,
                total_s=time.perf_counter() - t0)


def figures_32b(args) -> dict:
    from sim.paper_figures_32b import figures  # it runs this module's runs()
    return figures(args)


def only_32b(args: argparse.Namespace, t0: float, write: WriteJson) -> dict:
    """The 32B rows alone, written into the existing result beside its 8B figures."""
    d = figures_32b(args) | {"total_s": time.perf_counter() - t0}
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {}
    print("\n".join(report_32b({"qwen3_32b": d})) + f"\nwrote {args.out}")
    write(args.out, doc | {"qwen3_32b": d})
    return d
