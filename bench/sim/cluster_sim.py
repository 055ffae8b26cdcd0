"""Cluster-scale simulation of ROSE (sim/): step throughput, serving P99s and SLO attainment,
borrowed share and KV-affinity hit rate at 16-1,024 GPUs, per configuration.

    python -m bench.sim.cluster_sim [--steps 3] [--scales 16 64 256 1024] [--timing]

Every engine is the local CPU models' measured latency profile by default (sim/profiles/), so
those numbers are a fleet of such engines; --fleet NAME runs a GPU fleet instead
(sim/profiles/fleet_NAME.json: profiles measured on an H100 or H200 by bench/sim/engine_profile.py,
whole-length serving prompts, and the KV pool, train, publish and serving load derived by
sim/fleet.py), written to bench/results/cluster_sim_NAME.json; --rollout-profile /
--serving-profile NAME swap the profiles alone. Per scale,
"fixed" (serving GPUs only serve) runs first and sets the SLO at 2x its P99 TTFT/TPOT, as
bench/coserving/coserving_sweep.py does per load; the other configurations run at that SLO. --timing also
runs 1,024 GPUs x 50 steps of ROSE and records the wall time. --pipeline instead compares
synchronous and one-step off-policy steps (RunConfig.max_staleness 0 vs 1; SimConfig off_policy)
for fixed and ROSE at each scale and writes bench/results/cluster_sim_pipeline.json. Validation:
the local stack's two configurations (1 rollout GPU; + 1 serving GPU under the demo replay's
traffic) against bench/results/learning_fidelity.json's measured rollout times.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

from bench.lib.results import RESULTS, ROOT, write_json

from executors.policies.slo_admission import SLOConfig
from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.fleet import fleet_settings, load_fleet, sweep_settings
from sim.report import judged_at, rate_text, speedup
from sim.workload import fit_data_directory
from sim.profiles import PROFILE_DIR

OUT = RESULTS / "cluster_sim.json"
FIDELITY = RESULTS / "learning_fidelity.json"
ROWS = [("fixed", "turnwise_affinity"), ("rose", "turnwise_affinity"), ("slo_unaware", "turnwise_affinity"),
        ("static", "turnwise_affinity")]
ABLATIONS = [("rose", "pinned"), ("rose", "turnwise")]


def run(cfg: SimConfig) -> dict:
    return _printed(cfg, ClusterSim(cfg).run())


def _printed(cfg: SimConfig, r: dict) -> dict:
    print(f"  {cfg.gpus:>5} GPUs {cfg.config:>11} {cfg.mode:>17}: {rate_text(r):>10} tok/s, "
          f"wall {r['wall_s']:.1f} s", flush=True)
    return r


def scale_and_slo(args: argparse.Namespace, gpus: int) -> tuple[SimConfig, dict, dict, dict]:
    """The base config at `gpus`, the SLO there (2x the fixed configuration's P99s), and that one
    fixed run judged at the SLO it set and at the profile's (sim.report.judged_at: a fixed run's
    serving GPUs never read the SLO, so one run stands for both)."""
    base = SimConfig(gpus=gpus, steps=args.steps, seed=args.seed, workload=args.workload,
                     **sweep_settings(args.fleet, args.rate, args.rollout_profile, args.serving_profile))
    cfg = replace(base, config="fixed")
    sim = ClusterSim(cfg)
    at_profile = _printed(cfg, sim.run())
    if at_profile["ttft_p99_s"] is None or at_profile["tpot_p99_s"] is None:
        raise SystemExit(f"at {gpus} GPUs no serving request finished in {args.steps} step(s), so no SLO "
                         "can be derived: run more --steps, a larger scale or a higher --rate")
    slo = SLOConfig(2 * at_profile["ttft_p99_s"], 2 * at_profile["tpot_p99_s"])
    return base, dict(slo_ttft_s=slo.ttft_s, slo_tpot_s=slo.tpot_s), judged_at(sim, at_profile, slo), at_profile


def sweep(args: argparse.Namespace) -> list[dict]:
    rows = []
    for gpus in args.scales:
        base, slo, fixed, fixed_at_profile = scale_and_slo(args, gpus)
        rows.append(fixed)  # its attainment at the SLO it set
        todo = ROWS[1:] + (ABLATIONS if gpus == args.ablation_scale else [])
        for config, mode in todo:
            r = run(replace(base, config=config, mode=mode, **slo))
            r["speedup_vs_fixed"] = speedup(r, fixed)
            rows.append(r)
        if gpus == args.ablation_scale:  # the serving worker's own (tight) SLO rule: admission binds
            for config in ("fixed", "rose", "slo_unaware"):
                r = dict(fixed_at_profile) if config == "fixed" else run(replace(base, config=config))
                r["speedup_vs_fixed"] = speedup(r, fixed)
                r["slo_rule"] = "profile"
                rows.append(r)
    return rows


def pipeline(args: argparse.Namespace) -> list[dict]:
    """Synchronous vs one-step off-policy, fixed and ROSE, the SLO from the synchronous fixed run."""
    rows = []
    for gpus in args.scales:
        base, slo, fixed, _ = scale_and_slo(args, gpus)
        for config in ("fixed", "rose"):
            sync = fixed if config == "fixed" else run(replace(base, config=config, **slo))
            piped = run(replace(base, config=config, off_policy=1, **slo))
            piped["speedup_vs_synchronous"] = speedup(piped, sync)
            rows += [sync, piped]
    return rows


def validate(seed: int) -> dict:
    """The local stack: 1 trainer + 1 rollout worker (+ 1 serving worker under the demo's background
    replay: 8x faster, a quarter of the requests = 2x the trace rate), 128 trajectories a step."""
    d = json.loads(FIDELITY.read_text())
    out = {}
    for name, ratio in (("fixed", 0.0), ("borrowed", 1.0)):
        measured = [s["rollout_s"] for run_ in d["runs"][name].values() for s in run_["steps"]]
        cfg = SimConfig(gpus=2, config="fixed" if ratio == 0 else "rose", serving_ratio=ratio, steps=8,
                        seed=seed, traj_per_rollout_gpu=128, serving_rate=2.0)
        sim = ClusterSim(cfg).run()
        med = statistics.median(measured)
        out[name] = {"measured_rollout_s_median": med, "measured_rollout_s_range": [min(measured), max(measured)],
                     "simulated_rollout_s": sim["rollout_s_mean"],
                     "error": sim["rollout_s_mean"] / med - 1, "simulated_borrowed_share": sim["borrowed_share"]}
    return out


def _recorded(data_dir: Path, run: str) -> tuple[int, list[float]]:
    """(trajectories per step, measured rollout seconds of steps 2..) of a recorded run."""
    import duckdb

    cfg = json.loads((data_dir / "runs" / run / "config.json").read_text())
    measured = [r[0] for r in duckdb.sql(
        f"SELECT rollout_s FROM read_parquet('{data_dir}/metrics/steps/**/*.parquet', "
        f"hive_partitioning=true, union_by_name=true) WHERE run = '{run}' AND step > 1").fetchall()]
    if not measured:
        raise SystemExit(f"no step metrics after step 1 for run {run!r} under {data_dir}")
    return cfg["rollout"]["groups"] * cfg["rollout"]["group_size"], measured


def _local_rollout_s(per_step: int, steps: int, seed: int, scale: float) -> float:
    return ClusterSim(SimConfig(gpus=2, config="fixed", serving_ratio=0.0, steps=steps, seed=seed,
                                traj_per_rollout_gpu=per_step, engine_scale=scale)).run()["rollout_s_mean"]


def validate_runs(data_dir: Path, fit_run: str, check_run: str, seed: int) -> dict:
    """Runs recorded on this machine (1 rollout worker, no serving worker; step 1 left out: engine
    warm-up). The engine scale is calibrated on `fit_run` (bisection on the one factor), then
    simulated vs measured rollout seconds of `check_run`, a run the calibration never saw;
    fit the workload from `fit_run` too, or the check is circular."""
    per_step, fit = _recorded(data_dir, fit_run)
    target, lo, hi = statistics.median(fit), 0.25, 8.0
    for _ in range(12):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if _local_rollout_s(per_step, len(fit), seed, mid) < target else (lo, mid)
    scale = (lo * hi) ** 0.5
    per_check, measured = _recorded(data_dir, check_run)
    med = statistics.median(measured)
    raw = _local_rollout_s(per_check, len(measured), seed, 1.0)
    sim = _local_rollout_s(per_check, len(measured), seed, scale)
    return {"fit_run": fit_run, "check_run": check_run, "engine_scale": scale,
            "measured_rollout_s_median": med, "measured_rollout_s": measured,
            "simulated_rollout_s_profile": raw, "error_profile": raw / med - 1,
            "simulated_rollout_s_calibrated": sim, "error_calibrated": sim / med - 1}


def timing(seed: int) -> dict:
    """1,024 GPUs x 50 steps of ROSE: wall seconds, and CPU seconds (what the machine's other
    load inflates less), with the load average before and after."""
    load0, t0, c0 = os.getloadavg(), time.perf_counter(), time.process_time()
    r = ClusterSim(SimConfig(gpus=1024, config="rose", steps=50, seed=seed)).run()
    return {"gpus": 1024, "steps": 50, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "events": r["events"], "load_avg_before": load0, "load_avg": os.getloadavg(),
            "tokens_per_s": r["tokens_per_s"]}


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def table(rows: list[dict]) -> str:
    def ms(x):
        return "-" if x is None else f"{1000 * x:.0f}"

    lines = ["| GPUs (train+rollout / serving) | config | routing | tokens/s | vs fixed | step s | P99 TTFT / TPOT ms "
             "(SLO) | SLO met | borrowed | affinity hit |", "| --- " * 10 + "|"]
    for r in rows:
        att = "-" if r["slo_attainment"] is None else f"{100 * r['slo_attainment']:.1f}%"
        mode = r["mode"] + (", profile SLO" if r.get("slo_rule") else "")
        lines.append(
            f"| {r['gpus']} / {r['serving_gpus']} | {r['config']} | {mode} | {rate_text(r)} | "
            f"{_x(r.get('speedup_vs_fixed', 1.0))} | {r['step_s_mean']:.2f} | {ms(r['ttft_p99_s'])} / "
            f"{ms(r['tpot_p99_s'])} ({ms(r['slo_ttft_s'])} / {ms(r['slo_tpot_s'])}) | {att} | "
            f"{100 * r['borrowed_share']:.0f}% | {100 * r['affinity_hit_rate']:.0f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rate", type=float, default=None,
                    help="trace speed-up per serving GPU (default 6, or the fleet's derived rate)")
    ap.add_argument("--fleet", default=None, help="sim/profiles/fleet_<name>.json: a GPU fleet")
    ap.add_argument("--workload", default=SimConfig.workload,
                    help="sim/profiles/<name>.json: the trajectories' turns, tokens and env times")
    ap.add_argument("--fit-workload", nargs=2, metavar=("DATA_DIR", "NAME"),
                    help="fit the workload from the turns recorded under a ROSE data directory "
                    "(rose train's --data-dir), save it as sim/profiles/workload_NAME.json and use it")
    ap.add_argument("--ablation-scale", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    # a profile measured on another device kind (latency_profile.py format) dropped into
    # sim/profiles/ runs the same sweep on it; the default is the local CPU engines'
    ap.add_argument("--rollout-profile", default=SimConfig.rollout_profile,
                    help="sim/profiles/<name>.json of the rollout engines")
    ap.add_argument("--serving-profile", default=SimConfig.serving_profile,
                    help="sim/profiles/<name>.json of the serving engines")
    ap.add_argument("--timing", action="store_true", help="also time 1,024 GPUs x 50 steps")
    ap.add_argument("--pipeline", action="store_true", help="synchronous vs one-step off-policy")
    ap.add_argument("--validate-runs", nargs=3, metavar=("DATA_DIR", "FIT_RUN", "CHECK_RUN"),
                    help="also calibrate the engine scale on one recorded run (1 rollout worker) "
                    "and check it on another")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    for name in (args.rollout_profile, args.serving_profile):
        if not (PROFILE_DIR / f"{name}.json").is_file():
            known = sorted(p.stem for p in PROFILE_DIR.glob("*.json")
                           if not p.stem.startswith(("gpu_sources", "workload", "fleet_"))
                           and not p.stem.endswith("_train"))
            ap.error(f"no simulator profile {name!r} in {PROFILE_DIR}; shipped: {known}")
    if args.fit_workload:
        args.workload = fit_workload(ap, Path(args.fit_workload[0]), args.fit_workload[1])
    if not (PROFILE_DIR / f"{args.workload}.json").is_file():
        ap.error(f"no workload {args.workload!r} in {PROFILE_DIR}")
    args.fleet_settings, fleet_how = None, None
    if args.fleet:
        try:
            args.fleet_settings, fleet_how = fleet_settings(load_fleet(args.fleet))
        except (FileNotFoundError, ValueError) as e:
            ap.error(str(e))
    t0 = time.perf_counter()
    if args.pipeline:
        return pipeline_main(args, t0)
    args.out = args.out or (OUT.with_name(f"cluster_sim_{args.fleet}.json") if args.fleet else OUT)
    rows = sweep(args)
    local = not args.fleet  # the local stack's checks and timing are about the CPU engines
    result = {"bench": "cluster_sim", "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                                               if k != "fleet_settings"},
              "rows": [{k: v for k, v in r.items() if k != "per_step"} for r in rows],
              "fleet": {"settings": args.fleet_settings, "derived": fleet_how} if args.fleet else None,
              "validation": validate(args.seed) if FIDELITY.is_file() and local else None,
              "validation_runs": (validate_runs(Path(args.validate_runs[0]), *args.validate_runs[1:], args.seed)
                                  if args.validate_runs else _earlier_validation_runs(args.out) if local else None),
              "timing": timing(args.seed) if args.timing else None,
              "plot": None,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
              "total_s": None}
    result["total_s"] = time.perf_counter() - t0
    print(table(rows))
    print(json.dumps({k: result[k] for k in ("fleet", "validation", "validation_runs", "timing")}, indent=1))
    png = args.out.with_suffix(".png")
    if importlib.util.find_spec("matplotlib") is None:  # the dev extra
        result["plot"] = "skipped: matplotlib is not installed"
    else:
        from bench.sim.cluster_sim_plot import plot

        plot(result, png)
        result["plot"] = str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
    write_json(args.out, result)
    print(f"plot: {result['plot']}")


def fit_workload(ap: argparse.ArgumentParser, data_dir: Path, name: str) -> str:
    """sim/profiles/workload_NAME.json fitted from the turns (and step metrics) under data_dir."""
    out = PROFILE_DIR / f"workload_{name}.json"
    try:
        spec = fit_data_directory(data_dir, out)
    except FileExistsError:
        ap.error(f"{out} exists: choose another NAME (nothing was overwritten)")
    except FileNotFoundError as e:
        ap.error(str(e))
    print(f"wrote {out}: {spec.source}")
    return out.stem


def _earlier_validation_runs(out: Path) -> dict | None:
    """No recorded runs given: keep the check the output file already holds (its runs' data
    directory is rarely still there), marked as carried over."""
    try:
        earlier = json.loads(out.read_text()).get("validation_runs")
    except (OSError, ValueError):
        return None
    if earlier and "carried_over" not in earlier:
        earlier = {**earlier, "carried_over": "from an earlier bench run with --validate-runs (not re-run)"}
    return earlier


def pipeline_main(args: argparse.Namespace, t0: float) -> None:
    rows = pipeline(args)
    lines = ["| GPUs | config | steps | tokens/s | step s | SLO met | off-policy / synchronous |",
             "| --- " * 7 + "|"]
    for r in rows:
        att = "-" if r["slo_attainment"] is None else f"{100 * r['slo_attainment']:.1f}%"
        gain = _x(r["speedup_vs_synchronous"]) if "speedup_vs_synchronous" in r else ""
        lines.append(f"| {r['gpus']} / {r['serving_gpus']} | {r['config']} | "
                     f"{'one-step off-policy' if r['off_policy'] else 'synchronous'} | "
                     f"{rate_text(r)} | {r['step_s_mean']:.2f} | {att} | {gain} |")
    print("\n".join(lines))
    out = args.out or OUT.with_name("cluster_sim_pipeline.json")
    write_json(out, {"bench": "cluster_sim --pipeline", "args": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "fleet_settings"},
        "rows": [{k: v for k, v in r.items() if k != "per_step"} for r in rows],
        "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
        "total_s": time.perf_counter() - t0})


if __name__ == "__main__":
    main()
