"""The megatron trainer's CUDA path, checked in one short run on a GPU machine (not part of the
test suite: nothing here needs a GPU to pass `make test`).

    python -m bench.learning.gpu_check            # ~1-2 min on one GPU; writes bench/results/gpu_check.json

One GRPO step of the demo-shaped policy (random weights, synthetic turns) by the megatron-core
trainer twice from the same weights: on the CPU (gloo, fp32) and on CUDA (NCCL, bf16 compute
over fp32 master weights). Checks: the two losses agree within bf16's tolerance, the updated
weights too, the CUDA trainer's weights published through the sharded publisher come back
from the relay bit for bit, and a trainer resumed from a checkpoint of step 1 takes step 2 as
the one that went straight on did. Exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result
from bench.learning.train_backends import SHAPES, synthetic_turns, write_policy

LOSS_RTOL = 3e-2  # bf16 compute against fp32: ~3 significant digits
WEIGHT_ATOL = 5e-4  # one step at lr 1e-4: an update differs by at most about lr x a few
RESUME_ATOL = 1e-6  # the same step from the same state: equal but for kernel-order rounding


def _rank(_: int, device: str, policy: str, out: str, rendezvous: str) -> None:
    import torch

    from executors.training.megatron_trainer import MegatronTrainer
    from executors.training.process_group import join, leave
    from core.config import ModelsConfig, RunConfig, TrainConfig

    os.environ["ROSE_DATA_DIR"] = str(Path(out) / f"data-{device}")
    cfg = RunConfig(run_id=f"gpu-check-{device}", models=ModelsConfig(policy_dir=Path(policy)),
                    train=TrainConfig(backend="megatron", micro_batch=4, lr=1e-4))
    join(0, cfg.train.parallel, rendezvous, device)
    try:
        trainer = MegatronTrainer(cfg, device)
        stats = trainer.train_step(synthetic_turns(1, int(trainer.hf_config.vocab_size)))
        weights = trainer.local_weights(torch.float32)
        result = {"loss": stats["loss"], "grad_norm": stats["grad_norm"],
                  "weights": {n: t.cpu() for n, t in weights.items()},
                  "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
        result["published_equal"] = _publish_round_trip(cfg, trainer, Path(out) / f"relay-{device}")
        result["resume_max_diff"] = _resume_round_trip(cfg, trainer, device)
        torch.save(result, Path(out) / f"{device}.pt")
    finally:
        leave()


def _resume_round_trip(cfg, trainer, device: str) -> float:
    """Checkpoint after the first step, take a second step, then resume a fresh trainer from the
    checkpoint and take the same second step: the largest weight difference between the two."""
    import torch

    from executors.training.megatron_trainer import MegatronTrainer

    trainer.save_checkpoint()
    vocab = int(trainer.hf_config.vocab_size)
    trainer.train_step(synthetic_turns(2, vocab))
    straight = trainer.local_weights(torch.float32)
    resumed = MegatronTrainer(cfg, device)
    if resumed.version != 1:
        raise RuntimeError(f"resumed at version {resumed.version}, not the checkpoint's 1")
    resumed.train_step(synthetic_turns(2, vocab))
    again = resumed.local_weights(torch.float32)
    return max(float((again[n] - straight[n]).abs().max()) for n in straight)


def _publish_round_trip(cfg, trainer, root: Path) -> bool:
    """The trainer's bf16 weights through the sharded publisher and a TP=1 receiver: equal bits?"""
    import torch

    from executors.workers.publishers import policy_full_specs
    from storage.relay.filesystem import FilesystemRelay
    from storage.shards.grain import PublishLayout
    from storage.shards.layout import ParallelLayout
    from storage.weights.sharded_publisher import ShardedPublisher
    from storage.weights.sharded_versions import commit_sharded
    from storage.weights.sharded_receiver import ShardedReceiver

    relay, specs, layout = FilesystemRelay(root), policy_full_specs(cfg), PublishLayout(ParallelLayout(1))
    held = {n: t.cpu() for n, t in trainer.weights_bf16().items()}
    ShardedPublisher(relay, cfg.run_id, layout, trainer.layout_rank, specs).publish(1, held)
    commit_sharded(relay, cfg.run_id, 1, layout, specs)
    receiver = ShardedReceiver(relay, cfg.run_id, ParallelLayout(1))
    receiver.pull(1)
    return held.keys() == receiver.tensors.keys() and all(
        torch.equal(held[n].view(torch.int16), receiver.tensors[n].view(torch.int16)) for n in held)


def main() -> None:
    import torch
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here (torch.cuda.is_available() is False)")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        policy = write_policy(Path(tmp) / "policy", SHAPES["demo"])
        for device in ("cpu", "cuda"):
            rendezvous = f"file://{tmp}/rendezvous-{device}"
            mp.spawn(_rank, args=(device, str(policy), tmp, rendezvous), nprocs=1, join=True)
        cpu, cuda = (torch.load(Path(tmp) / f"{d}.pt") for d in ("cpu", "cuda"))
    rel = abs(cuda["loss"] - cpu["loss"]) / max(abs(cpu["loss"]), 1e-12)
    worst = max(float((cuda["weights"][n] - cpu["weights"][n]).abs().max()) for n in cpu["weights"])
    grad_rel = abs(cuda["grad_norm"] - cpu["grad_norm"]) / max(cpu["grad_norm"], 1e-12)
    checks = {"loss": rel <= LOSS_RTOL, "grad_norm": grad_rel <= LOSS_RTOL, "weights": worst <= WEIGHT_ATOL,
              "published": cuda["published_equal"], "resumed": cuda["resume_max_diff"] <= RESUME_ATOL}
    print_table(f"megatron trainer, CPU (gloo, fp32) vs {cuda['device_name']} (NCCL, bf16 compute)",
                ["check", "measured", "tolerance", "ok"],
                [("loss", f"{cpu['loss']:+.6f} vs {cuda['loss']:+.6f} ({rel:.2e})", f"{LOSS_RTOL:g}",
                  str(checks["loss"])),
                 ("grad norm", f"{cpu['grad_norm']:.5f} vs {cuda['grad_norm']:.5f} ({grad_rel:.2e})",
                  f"{LOSS_RTOL:g}", str(checks["grad_norm"])),
                 ("weights, max |diff|", f"{worst:.2e}", f"{WEIGHT_ATOL:g}", str(checks["weights"])),
                 ("published == trainer (bits)", str(cuda["published_equal"]), "exact", str(checks["published"])),
                 ("step 2 resumed vs straight, max |diff|", f"{cuda['resume_max_diff']:.2e}", f"{RESUME_ATOL:g}",
                  str(checks["resumed"]))])
    write_result(args.out, "gpu_check", args, started, device=cuda["device_name"], loss_cpu=cpu["loss"],
                 loss_cuda=cuda["loss"], loss_rel_diff=rel, weight_max_diff=worst,
                 resume_max_diff_cpu=cpu["resume_max_diff"], resume_max_diff_cuda=cuda["resume_max_diff"],
                 checks=checks)
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
