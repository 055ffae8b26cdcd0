"""Choosing the trainer backend: the example config loads, and a layout the policy or the stack
cannot take is refused with its reason before anything starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.config import ModelsConfig, RunConfig, StackConfig, TrainConfig, TrainParallel
from rose.config_file import ConfigError, load_run_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_every_example_config_loads() -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert files
    for f in files:
        load_run_config(f)
    cfg = load_run_config(EXAMPLES / "megatron_tp2.yaml")
    assert cfg.train.backend == "megatron" and cfg.train.parallel.world == 2 and cfg.stack.trainers == 2
    assert cfg.publishes_sharded


@pytest.mark.parametrize("par, trainers, reason", [
    (TrainParallel(tp=4), 4, "tensor parallel 4 must divide the 4 attention heads and the 2 key/value heads"),
    (TrainParallel(pp=3), 3, "pipeline parallel 3 must divide the 2 layers"),
    (TrainParallel(tp=2), 1, "needs 2 trainer workers, stack.trainers is 1"),
])
def test_bad_layouts_refused_before_the_stack_starts(tmp_path, monkeypatch, par, trainers, reason) -> None:
    from megatron_ranks import tiny_policy
    from rose.launch import check_trainer_layout

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path / "data"))
    cfg = RunConfig(models=ModelsConfig(policy_dir=tiny_policy(tmp_path / "policy")),
                    stack=StackConfig(trainers=trainers),
                    train=TrainConfig(backend="megatron", parallel=par))
    with pytest.raises(ConfigError, match=reason):
        check_trainer_layout(cfg)
    check_trainer_layout(cfg.model_copy(update={"train": TrainConfig(backend="megatron")}))


def test_hf_trainer_refuses_a_megatron_checkpoint(tmp_path, monkeypatch) -> None:
    from executors.workers.trainer import Trainer
    from megatron_ranks import tiny_policy

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path / "data"))
    cfg = RunConfig(models=ModelsConfig(policy_dir=tiny_policy(tmp_path / "policy")))
    step = cfg.run_dir() / "checkpoints" / "step-00000001"
    step.mkdir(parents=True)
    (step / "shard-t0-p0.safetensors").write_bytes(b"")
    (step / "meta.json").write_text('{"format": "rose-megatron", "step": 1}')
    with pytest.raises(ValueError, match="written by another trainer backend .format 'rose-megatron'"):
        Trainer(cfg)
