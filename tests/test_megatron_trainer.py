"""The megatron-core backend trains exactly what the Hugging Face backend trains: from the same
weights and trajectories, TP=2, PP=2 and DP=2 give the TP=1 run's losses and updated weights
within float tolerance over 3 steps, TP=1 gives the Hugging Face trainer's, and a checkpoint
resumes under another layout as if never interrupted. One test: the runs are shared, and
the megatron runs take turns in one launch of two ranks (its imports paid once)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_ranks import launch, runs_rank, step_turns, tiny_policy
from core.config import ModelsConfig, RunConfig, TrainConfig, TrainParallel

pytest.importorskip("megatron.core", reason="megatron-core not importable", exc_type=ImportError)
STEPS = 3
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-6  # fp32, different summation orders


def _cfg(policy, par: TrainParallel) -> RunConfig:
    backend = "hf" if par is None else "megatron"
    train = TrainConfig(backend=backend, micro_batch=2, lr=1e-3,
                        **({} if par is None else {"parallel": par}))
    return RunConfig(models=ModelsConfig(policy_dir=policy), train=train)


def _launch(policy, tmp_path, runs: list[tuple[str, TrainParallel, int, str, Path]]) -> list[Path]:
    """The runs (rank function, layout, steps, out tag, ROSE_DATA_DIR) in turn in one launch of
    as many ranks as the widest layout has; each run's ranks save under its out folder."""
    specs = []
    for fn, par, steps, tag, data in runs:
        out = tmp_path / f"tp{par.tp}pp{par.pp}dp{par.dp}{tag}"
        out.mkdir()  # a file rendezvous per run: no port that another test could take meanwhile
        specs.append((fn, _cfg(policy, par).model_dump_json(), f"file://{out}/rendezvous", str(out), steps,
                      str(data)))
    launch(runs_rank, (specs,), nprocs=max(par.world for _, par, *_ in runs))
    return [Path(spec[3]) for spec in specs]


def _gather(policy, out: Path, par: TrainParallel) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """One run's stats (every rank agreeing) and its full weights assembled from the TP shards."""
    from storage.shards.plan import assemble
    from storage.shards.rules import infer_rule
    from transformers import AutoConfig

    ranks = [torch.load(out / f"rank{r}.pt") for r in range(par.world)]
    def same(s: list[dict]) -> list[dict]:
        return [{k: v for k, v in x.items() if k != "train_s"} for x in s]

    assert all(same(r["stats"]) == same(ranks[0]["stats"]) for r in ranks)  # every rank agrees
    hf_cfg = AutoConfig.from_pretrained(policy)
    shards: dict[str, dict[int, torch.Tensor]] = {}
    for r in ranks:
        tp, _, dp = r["rank"]
        if dp == 0:
            for name, t in r["weights"].items():
                shards.setdefault(name, {})[tp] = t
    full = {}
    for name, by_tp in shards.items():
        parts = [by_tp[t] for t in range(par.tp)]
        rule = infer_rule(name, parts[0].shape, None, hf_cfg)
        shape = list(parts[0].shape)
        if rule.dim is not None:
            shape[rule.dim] *= par.tp
        full[name] = assemble(parts, rule, shape)
    return ranks[0]["stats"], full


def _hf(policy, monkeypatch, tmp_path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    from executors.workers.trainer import Trainer

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path / "hf-data"))
    trainer = Trainer(_cfg(policy, None))
    stats = [trainer.train_step(step_turns(s, trainer.version)) for s in range(1, STEPS + 1)]
    return stats, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _close(a: tuple, b: tuple) -> None:
    (sa, wa), (sb, wb) = a, b
    for x, y in zip(sa, sb):
        for k in ("loss", "kl", "grad_norm", "tis_mean_weight"):
            assert x[k] == pytest.approx(y[k], rel=LOSS_RTOL, abs=1e-9), k
        assert x["train_tokens"] == y["train_tokens"] and x["trained_trajectories"] == y["trained_trajectories"]
    assert wa.keys() == wb.keys()
    for name in wa:
        assert (wa[name] - wb[name]).abs().max() <= WEIGHT_ATOL, name


@pytest.mark.timeout(600)
def test_megatron_layouts_train_what_the_hf_trainer_trains(tmp_path, monkeypatch) -> None:
    """TP=1 equals the HF trainer over 3 steps; TP=2, PP=2, DP=2 equal TP=1; and a checkpoint
    written at TP=2 after step 1, resumed at PP=2 for steps 2-3, equals TP=1's 3 steps."""
    policy = tiny_policy(tmp_path / "policy")
    hf = _hf(policy, monkeypatch, tmp_path)
    assert hf[0][-1]["version"] == STEPS and all(s["stale_tokens"] > 0 for s in hf[0])
    from safetensors.torch import load_file

    start = load_file(policy / "model.safetensors")
    moved = max(float((hf[1][n] - start[n].float()).abs().max()) for n in hf[1])
    assert moved > 100 * WEIGHT_ATOL  # the update is far above the tolerance it is held to
    layouts = (TrainParallel(tp=2), TrainParallel(pp=2), TrainParallel(dp=2))
    resumed = tmp_path / "resumed"
    runs = [("train", par, STEPS, "", tmp_path) for par in layouts]
    runs += [("checkpoint", TrainParallel(tp=2), 1, "-a", resumed),
             ("checkpoint", TrainParallel(pp=2), 2, "-b", resumed),
             # world 1 last: the other rank is done by then, not waiting to join the next group
             ("checkpoint", TrainParallel(), STEPS, "", tmp_path / "straight")]
    outs = _launch(policy, tmp_path, runs)
    tp1 = _gather(policy, outs[-1], TrainParallel())
    _close(tp1, hf)
    for out, par in zip(outs, layouts):
        _close(_gather(policy, out, par), tp1)
    first, rest = _gather(policy, outs[3], TrainParallel(tp=2)), _gather(policy, outs[4], TrainParallel(pp=2))
    _close((first[0] + rest[0], rest[1]), tp1)
    ckpts = sorted((tmp_path / "resumed" / "runs" / "demo" / "checkpoints").iterdir())
    assert [p.name for p in ckpts] == ["step-00000001", "step-00000002", "step-00000003"]
