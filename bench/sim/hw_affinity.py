"""Hardware affinity in the simulator (issue 40 item 4; RollArt Fig. 11a): a mixed H800 + H20
rollout fleet routing FrozenLake to the H800s and the rest to the H20s (rollout.hw_affinity)
against fleets of the same cost of one kind, and the mixed fleet without affinity.

    python -m bench.sim.hw_affinity [--batch 64 256] [--cap 16 256] [--steps 2] [--seeds 0 1]

Fleets at RollArt's cost ratio (Table 2: an H800 costs 2.85 H20s; Fig. 11a: 64 H800 + 24 H20
vs 72 H800 vs 208 H20), an eighth of its size: 8 H800 + 3 H20 vs 9 H800 vs 26 H20; 4 trainer
GPUs for all (RollArt fixes 32 for training). The H800s run the H100 profile measured on a lent
H100 (the same chip and HBM), the H20s that profile scaled by sim/roofline.py from the two
devices' published specifications. Each step launches the same batch, half FrozenLake
(prefill-heavy), half GEM-Math (decode-heavy), as sim/hw_affinity.py describes. The check:
one environment alone on 2 H800 vs 6 H20 (RollArt Fig. 4, cost-equal: FrozenLake's rollout on
H800 down to 0.53x of H20's, GEM-Math's on H20 0.49-0.79x of H800's). Compared: rollout time
(RollArt trains asynchronously on GPUs of its own, so its step time is the rollout's; the
synchronous step times are in the JSON). Each row at the router's cap of 16 turns per GPU (the
product's default) and at 256 (concurrency left to the KV pool, as a vLLM engine alone runs).
Writes bench/results/hw_affinity.json.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result

from executors.policies.hw_affinity import HwAffinity
from sim.config import SimConfig
from sim.engine_cost import ContextCost
from sim.fleet import sweep_settings
from sim.hw_affinity import ROLLART_AFFINITY, AffinitySim, DeviceClass, kv_blocks
from sim.profiles import load_profile
from sim.roofline import H20, H100_SXM, H800, DeviceSpec, ModelShape, scale_profile, speedups

OUT = RESULTS / "hw_affinity.json"
FLEET = "h100_qwen3_8b"  # Qwen3-8B rollouts: RollArt's FrozenLake / GEM-Math model (Fig. 4)
SHAPE = "qwen3-8b"
TRAINERS = 4
ROLLART_11A = (1.12, 1.37)  # mixed vs H800-only, step time
ROLLART_11A_H20 = (1.30, 1.68)  # mixed vs H20-only
ROLLART_FIG4 = "FrozenLake: H800 down to 0.53x of H20; GEM-Math: H20 0.49-0.79x of H800"


def device_class(name: str, spec: DeviceSpec, count: int, shape: ModelShape) -> DeviceClass:
    measured = load_profile(sweep_settings(FLEET, None)["rollout_profile"])
    profile = measured if spec.tflops == H100_SXM.tflops and spec.hbm_tb_s == H100_SXM.hbm_tb_s \
        else scale_profile(measured, shape, H100_SXM, spec)
    ctx = ContextCost.derive(profile, shape.params, shape.layers, shape.q_dim, shape.kv_bytes_per_token,
                             spec.hbm_tb_s, spec.source)
    return DeviceClass(name, spec.name, count, profile, ctx,
                       kv_blocks(spec.memory_gb, shape.params, shape.kv_bytes_per_token), spec.cost)


def run_one(args: argparse.Namespace, shape: ModelShape, h800: int, h20: int, mix: dict[str, float],
            batch: int, cap: int, seed: int, affinity: HwAffinity | None) -> dict:
    fleet = [device_class("compute", H800, h800, shape), device_class("bandwidth", H20, h20, shape)]
    settings = sweep_settings(FLEET, None)
    cfg = SimConfig(gpus=h800 + h20 + TRAINERS, trainers=TRAINERS, config="fixed", serving_ratio=0.0,
                    steps=args.steps, seed=seed, cap_per_rollout_gpu=cap,
                    rollout_profile=settings["rollout_profile"], serving_profile=settings["serving_profile"],
                    train_s_per_token=settings["train_s_per_token"], publish_s=settings["publish_s"])
    r = AffinitySim(cfg, fleet, mix, batch, affinity).report()
    label = f"{h800} H800+{h20} H20" if h800 and h20 else (f"{h800} H800" if h800 else f"{h20} H20")
    print(f"  {label:>16} batch {batch:>4} cap {cap:>3} seed {seed} {'+'.join(mix):>20} "
          f"affinity={affinity is not None}: rollout {statistics.fmean(r['rollout_s']):.1f} s "
          f"(wall {r['wall_s']:.1f} s)", flush=True)
    return r | {"fleet": label, "h800": h800, "h20": h20, "cost": h800 * H800.cost + h20 * H20.cost,
                "batch": batch, "cap": cap, "seed": seed, "mix": mix,
                "affinity": dict(affinity.classes) if affinity is not None else None}


FLEETS = [("H800 only", 9, 0, None), ("H20 only", 0, 26, None), ("mixed", 8, 3, None),
          ("mixed + affinity", 8, 3, ROLLART_AFFINITY)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256], help="trajectories per step")
    ap.add_argument("--cap", type=int, nargs="+", default=[16, 256],
                    help="turns in flight per rollout GPU (the router's cap; 16 is the product's default, "
                         "256 leaves concurrency to the KV pool, as a vLLM engine alone would)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    t0 = time.perf_counter()
    shape = ModelShape.of(SHAPE)
    half = {"frozenlake": 0.5, "gem_math": 0.5}
    rows, checks, results, ratios = [], [], [], {}
    for batch in args.batch:
        for cap in args.cap:
            runs = {name: [run_one(args, shape, a, b, half, batch, cap, seed, aff) for seed in args.seeds]
                    for name, a, b, aff in FLEETS}
            results += [r for rs in runs.values() for r in rs]
            base = _mean(runs["mixed + affinity"])
            ratios[f"batch {batch}, cap {cap}"] = {name: _mean(rs) / base for name, rs in runs.items()}
            for name, rs in runs.items():
                fl = statistics.fmean(r["turn_share_by_class"].get("frozenlake", {}).get("compute", 0.0) for r in rs)
                gm = statistics.fmean(r["turn_share_by_class"].get("gem_math", {}).get("bandwidth", 0.0) for r in rs)
                rows.append((str(batch), str(cap), rs[0]["fleet"] + (", affinity" if rs[0]["affinity"] else ""),
                             f"{rs[0]['cost']:.2f}", f"{_mean(rs):.1f}", f"{_mean(rs) / base:.2f}x",
                             f"{fl:.0%} / {gm:.0%}", "" if all(r["finished"] for r in rs) else "unfinished"))
            for tag in ("frozenlake", "gem_math"):  # RollArt Fig. 4: one environment, 2 H800 vs 6 H20
                a = [run_one(args, shape, 2, 0, {tag: 1.0}, batch, cap, seed, None) for seed in args.seeds]
                b = [run_one(args, shape, 0, 6, {tag: 1.0}, batch, cap, seed, None) for seed in args.seeds]
                checks.append((str(batch), str(cap), tag, f"{_mean(a):.1f}", f"{_mean(b):.1f}",
                               f"{_mean(a) / _mean(b):.2f}x"))
                results += a + b
    print_table(f"Hardware affinity, Qwen3-8B, rollout time: mean of {args.steps} steps x {len(args.seeds)} "
                f"seeds; cost in H20s; / affinity's: over the mixed fleet with affinity (RollArt Fig. 11a: "
                f"{ROLLART_11A[0]}-{ROLLART_11A[1]}x for H800 only, {ROLLART_11A_H20[0]}-{ROLLART_11A_H20[1]}x "
                "for H20 only)",
                ["batch", "cap", "rollout fleet", "cost", "rollout s", "/ affinity's", "FL on H800, math on H20",
                 ""], rows)
    print_table(f"Check, one environment on cost-equal fleets (RollArt Fig. 4: {ROLLART_FIG4})",
                ["batch", "cap", "environment", "2 H800 rollout s", "6 H20 rollout s", "H800 / H20"], checks)
    scaling = {k: round(v, 3) for k, v in speedups(shape, H100_SXM, H20).items()}
    print_table("H20 step time over H100's by the roofline (sim/roofline.py)", list(scaling),
                [[f"{v:.2f}x" for v in scaling.values()]])
    write_result(args.out, "hw_affinity", args, t0, rollart_fig11a_vs_h800=ROLLART_11A,
                 rollart_fig11a_vs_h20=ROLLART_11A_H20, rollart_fig4=ROLLART_FIG4, h20_over_h100=scaling,
                 rollout_time_over_affinity=ratios, devices={d.name: d.source for d in (H100_SXM, H800, H20)},
                 runs=results)


def _mean(runs: list[dict], key: str = "rollout_s") -> float:
    """Mean over the runs' steps."""
    return statistics.fmean(x for r in runs for x in r[key])


if __name__ == "__main__":
    main()
