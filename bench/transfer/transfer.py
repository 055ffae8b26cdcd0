"""Weight transfer benchmark: bytes and time per publish, side by side, in one run.

Methods, on the same (base, new) bf16 tensor pairs:
  dense       the raw bits of every tensor
  shard_only  dense slices by shard plan (storage/shards/plan.py): a TP=--trainer-tp trainer
              pushes each distinct slice once, a TP=--server-tp receiver pulls only the
              slices its ranks hold (bytes summed over its ranks; a TP1 receiver needs all)
  coo_int32   int32 index + bf16 value per changed element (the ROSE paper's sparse format)
  xor_zstd1   new XOR base, zstd level 1, single thread (slime's delta scheme)
  ours        storage.delta.encode_delta: per tensor the smallest of ef (Elias-Fano positions
              + coded value differences), ternary, xor_zstd, coo, dense; header + checksums
The entropy bound (storage/delta/entropy.py) is summed over tensors: n*H(p) for positions plus
the order-0 entropy of the changed values' bit-pattern differences. Times are CPU seconds of the
process (every thread: a large tensor's blocks are coded on threads of their own, one thread
otherwise), since other jobs share this machine (wall times are in the JSON);
speeds are GB/s of dense bytes. Every decode is checked bit-exact.

Workloads (bench/transfer/transfer_workloads.py): (a) grpo: consecutive versions of our own GRPO run
(default: the newest run under $ROSE_DATA_DIR/runs with checkpoints; make one with
`rose train --steps 3`); (b) synthetic: Qwen2.5-0.5B-shaped, AdamW at each --lrs for each
--steps; --checkpoints OLD NEW: any two safetensors directories.
End to end (tests/transfer_e2e.py): publish-to-applied time of one version through a real
Mooncake relay, sender paced to each --gbps (emulated link; 0 = unpaced loopback), dense batch
baseline vs ours (each tensor coded or raw by the time model at that rate, on every core), on
the last grpo pair, the demo's own policy shape (1.7 MB, at --demo-lr, the demo's lr), and the
synthetic model at --e2e-params / --e2e-lr; with the time model and measured / model.
--split-cores puts the sender and the receiver on halves of the cores, as on two hosts.

Defaults (about 8-10 minutes on 2 busy cores): --params 200e6 (the full 0.5B shape is
--params 494e6), --lrs 1e-6 1e-5, --steps 1 3, --gbps 1 10 25 100 0, --e2e-params 100e6,
--e2e-lr 1e-6, --e2e-repeat 2 (best of 2: the machine is shared; a workload under one bucket,
such as the demo policy, whose tens of ms a disturbance would swamp, runs 31 back-to-back pairs
and also reports the median of their ratios).

    .venv/bin/python -m bench.transfer.transfer
    .venv/bin/python -m bench.transfer.transfer --params 494e6 --grpo-run /path/to/runs/r --no-e2e
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch
from rich.console import Console

from bench.transfer import transfer_workloads as wl
from bench.transfer.transfer_methods import CaseResult, codec_methods, measure_pair, shard_method
from bench.transfer.transfer_report import print_cases, print_e2e

from bench.lib.results import RESULTS, write_json


def run_synthetic(args, methods_for, console: Console) -> tuple[list[CaseResult], dict]:
    shapes, dims = wl.qwen_shapes(args.params)
    methods = methods_for(dims)
    total = sum(torch.Size(s).numel() for _, s in shapes)
    console.print(f"synthetic: {len(shapes)} tensors, {total / 1e6:.1f}M params, "
                  f"{dims['num_hidden_layers']} layers, vocab {dims['vocab_size']}")
    cases = {(lr, k): CaseResult(f"synthetic adamw lr={lr:g} steps={k}", methods)
             for lr in args.lrs for k in args.steps}
    t0 = time.perf_counter()
    for i, (name, shape) in enumerate(shapes):
        for lr in args.lrs:
            versions = wl.adamw_versions(name, shape, lr, max(args.steps), args.seed + i,
                                         args.master_init)
            for k in args.steps:
                measure_pair(cases[(lr, k)], name, versions[0], versions[k], args.repeat)
            del versions
        if i % 40 == 0:
            console.print(f"  [{i + 1}/{len(shapes)}] {name} {shape}  "
                          f"{time.perf_counter() - t0:.0f}s", highlight=False)
    return list(cases.values()), {"params": total, "dims": dims, "master_init": args.master_init}


def run_grpo(args, methods_for, console: Console) -> tuple[list[CaseResult], list, dict]:
    from core.config import data_dir

    run = args.grpo_run or wl.find_grpo_run(data_dir())
    if run is None:
        console.print(f"[yellow]no GRPO run with checkpoints under {data_dir()}/runs: skipping "
                      "(a); make one with `rose train --steps 3`[/]")
        return [], [], {}
    policy = args.policy_dir or data_dir() / "models" / "policy"
    versions = wl.grpo_versions(run, policy)
    dims = wl.model_config(policy) if (Path(policy) / "config.json").is_file() else {}
    methods = methods_for(dims)
    cases = []
    for label, old, new in wl.pairs(versions):
        case = CaseResult(f"grpo {Path(run).name} {label}", methods)
        for name in old:
            measure_pair(case, name, old[name], new[name], args.repeat)
        cases.append(case)
    console.print(f"grpo: run {run}, versions {[v for v, _ in versions]}, "
                  f"{wl.numel(versions[0][1]) / 1e6:.2f}M params")
    last = list(wl.pairs(versions))[-1:] if len(versions) >= 2 else []
    return cases, last, {"run": str(run), "versions": [v for v, _ in versions],
                         "params": wl.numel(versions[0][1]) if versions else 0}


def split_cores() -> tuple[list[int], list[int]]:
    """Pin this process to the first half of its cores; the other half is the receiver's."""
    from tests.transfer_e2e import pin_threads

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit(f"--split-cores needs at least 2 cores, this process has {len(cores)}")
    half = len(cores) // 2
    pin_threads(cores[:half])
    return cores[:half], cores[half:]


def _host_speed() -> dict[str, list[float]] | None:
    """The coding speed ours' publisher chose by (this process's probe, as `rose train`'s)."""
    from storage.delta import host_speed

    return host_speed.measured().as_dict()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=200e6, help="synthetic model size (494e6: "
                   "the full Qwen2.5-0.5B shape)")
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    p.add_argument("--steps", type=int, nargs="+", default=[1, 3])
    p.add_argument("--master-init", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="best of N timings per tensor")
    p.add_argument("--trainer-tp", type=int, default=2)
    p.add_argument("--server-tp", type=int, default=1)
    p.add_argument("--grpo-run", type=Path, help="run dir with checkpoints/ (default: newest)")
    p.add_argument("--policy-dir", type=Path, help="the run's initial policy (version 0)")
    p.add_argument("--checkpoints", type=Path, nargs=2, metavar=("OLD_DIR", "NEW_DIR"))
    p.add_argument("--no-synthetic", action="store_true")
    p.add_argument("--no-grpo", action="store_true")
    p.add_argument("--no-e2e", action="store_true")
    p.add_argument("--gbps", type=float, nargs="+", default=[1, 10, 25, 100, 0],
                   help="emulated link rates; 0 = unpaced loopback")
    p.add_argument("--demo-lr", type=float, default=5e-4, help="lr of the demo-policy workload")
    p.add_argument("--no-demo", action="store_true", help="skip the demo-policy e2e workload")
    p.add_argument("--e2e-params", type=float, default=100e6,
                   help="synthetic end-to-end model size; 0: no synthetic end-to-end workload")
    p.add_argument("--e2e-lr", type=float, default=1e-6)
    p.add_argument("--e2e-steps", type=int, default=1)
    p.add_argument("--e2e-repeat", type=int, default=2, help="best of N end-to-end runs")
    p.add_argument("--split-cores", action="store_true",
                   help="end to end: the sender (and its relay) on the first half of this "
                   "process's cores, the receiver on the other half, as on two hosts")
    p.add_argument("--own-segments", action="store_true",
                   help="end to end: no store client; the sender's own Mooncake segment holds "
                   "the versions and the receiver gets over loopback TCP (before `rose up` ran "
                   "a store client)")
    p.add_argument("--coder-processes", type=int, default=0,
                   help="ours codes in this many processes (storage/weights/coder_processes.py)")
    p.add_argument("--out", type=Path, default=RESULTS / "transfer.json")
    args = p.parse_args()
    torch.set_num_threads(1)  # the per-method table times one thread; e2e codes in a pool
    sender_cores, reader_cores = split_cores() if args.split_cores else (None, None)

    console = Console() if sys.stdout.isatty() else Console(width=150)
    t_start = time.perf_counter()
    methods_for = lambda dims: codec_methods(  # noqa: E731
        shard_method(dims, args.trainer_tp, args.server_tp) if dims else None)
    results, config, e2e_work = [], {"synthetic": {}, "grpo": {}}, []
    if not args.no_grpo:
        cases, last, config["grpo"] = run_grpo(args, methods_for, console)
        results += cases
        e2e_work += [(f"grpo {label}", old, new) for label, old, new in last]
    if args.checkpoints:
        old, new = (wl._load_bf16(d) for d in args.checkpoints)
        case = CaseResult(f"checkpoints {args.checkpoints[0].name} -> "
                          f"{args.checkpoints[1].name}", methods_for({}))
        for name in sorted(old.keys() & new.keys()):
            if old[name].shape == new[name].shape:
                measure_pair(case, name, old[name], new[name], args.repeat)
        results.append(case)
    if not args.no_synthetic:
        cases, config["synthetic"] = run_synthetic(args, methods_for, console)
        results += cases
    summaries = [r.summary() for r in results]
    print_cases(console, [{k: v for k, v in s.items() if k != "tensors"} for s in summaries])
    e2e_rows: list[dict] = []
    if not args.no_e2e and not args.no_demo:
        old, new = wl.demo_policy_model(args.demo_lr, args.e2e_steps, args.seed)
        e2e_work.append((f"demo policy {wl.numel(new) / 1e6:.2f}M lr={args.demo_lr:g} "
                         f"steps={args.e2e_steps}", old, new))
    if not args.no_e2e:
        if args.e2e_params > 0:  # 0: the demo policy (and GRPO) workloads only
            old, new, _ = wl.synthetic_model(args.e2e_params, args.e2e_lr, args.e2e_steps,
                                             args.seed)
            e2e_work.append((f"synthetic {wl.numel(new) / 1e6:.0f}M lr={args.e2e_lr:g} "
                             f"steps={args.e2e_steps}", old, new))
        from tests.transfer_e2e import run_e2e

        e2e_rows = run_e2e(e2e_work, args.gbps, repeat=args.e2e_repeat,
                           log=lambda m: console.print(m, highlight=False),
                           reader_cores=reader_cores, own_segments=args.own_segments,
                           coder_processes=args.coder_processes)
        print_e2e(console, e2e_rows)
    elapsed = time.perf_counter() - t_start
    write_json(args.out, {"bench": "transfer", "machine": platform.platform(),
                          "cpus": os.cpu_count(), "seconds": elapsed,
                          "sender_cores": sender_cores, "receiver_cores": reader_cores,
                          "args": {k: str(v) for k, v in vars(args).items()},
                          "workloads": config, "cases": summaries, "e2e": e2e_rows,
                          "host_speed": _host_speed() if e2e_rows else None})
    console.print(f"wrote {args.out} ({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
