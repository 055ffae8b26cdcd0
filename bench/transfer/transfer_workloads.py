"""Workloads of bench/transfer/transfer.py: consecutive published bf16 versions of a model.

(a) grpo: our own GRPO training. A run's checkpoints (<run>/checkpoints/step-N/model.safetensors,
    fp32 master weights) cast to bf16, which is exactly what the trainer publishes
    (executors/workers/trainer.py weights_bf16); version 0 is the policy model directory (bf16) when the
    run's first checkpoint is step 1.
(b) synthetic: a Qwen2.5-0.5B-shaped model (names and shapes from transformers' Qwen2Config:
    hidden 896, 24 layers, MLP 4864, 14/2 heads, vocab 151936, tied embeddings; 494M params;
    --params cuts layers, then vocabulary). fp32 masters ~ N(0, 0.02) (norms 1 + N(0, 0.1)), off
    the bf16 grid as mid-training; fresh torch AdamW (betas 0.9/0.999, eps 1e-8, weight decay
    0.01) at lr; gradients s_t * r_row * N(0, 1) redrawn each step, s_t log-uniform in
    [1e-4, 1e-2] per tensor, r_row = exp(N(0, 0.5)) per row. v0 = bf16 after 0 steps.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import torch

QWEN_0_5B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                 num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 tie_word_embeddings=True)
_STEP_DIR = re.compile(r"^step-(\d+)$")


# ---- (b) synthetic --------------------------------------------------------------------------
def _count(dims: dict) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**dims))
    return sum(p.numel() for p in model.parameters())


def qwen_shapes(params: float) -> tuple[list[tuple[str, tuple[int, ...]]], dict]:
    """Parameter names and shapes of Qwen2.5-0.5B cut to about `params` parameters (fewer
    layers first, then a smaller vocabulary), and the config dims used."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dims = dict(QWEN_0_5B)
    hidden, layers = dims["hidden_size"], dims["num_hidden_layers"]
    embed = dims["vocab_size"] * hidden
    per_layer = (_count(dims) - embed - hidden) / layers
    if params < embed + per_layer + hidden:
        dims["num_hidden_layers"] = 1
        dims["vocab_size"] = max(1024, int((params - per_layer - hidden) // hidden))
    else:
        fit = round((params - embed - hidden) / per_layer)
        dims["num_hidden_layers"] = max(1, min(layers, fit))
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**dims))
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()], dims


def adamw_versions(name: str, shape: tuple[int, ...], lr: float, steps: int, seed: int,
                   master_init: str = "fp32") -> list[torch.Tensor]:
    """Published bf16 versions v0..v{steps} of one tensor trained by AdamW from fresh state."""
    gen = torch.Generator().manual_seed(seed)
    if "norm" in name:
        master = 1 + 0.1 * torch.randn(shape, generator=gen)
    else:
        master = 0.02 * torch.randn(shape, generator=gen)
    if master_init == "bf16":
        master = master.to(torch.bfloat16).float()
    param = torch.nn.Parameter(master)
    opt = torch.optim.AdamW([param], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    scale = 10 ** (-4 + 2 * torch.rand((), generator=gen).item())
    row_shape = (shape[0],) + (1,) * (len(shape) - 1) if len(shape) > 1 else ()
    rows = torch.exp(0.5 * torch.randn(row_shape, generator=gen))
    versions = [param.detach().to(torch.bfloat16)]
    for _ in range(steps):
        param.grad = torch.randn(shape, generator=gen) * (scale * rows)
        opt.step()
        versions.append(param.detach().to(torch.bfloat16))
    return versions


def synthetic_model(params: float, lr: float, steps: int, seed: int = 0,
                    master_init: str = "fp32") -> tuple[dict, dict, dict]:
    """Whole-model (v0, v{steps}) bf16 dicts and the config dims (for the end-to-end runs)."""
    shapes, dims = qwen_shapes(params)
    old, new = {}, {}
    for i, (name, shape) in enumerate(shapes):
        versions = adamw_versions(name, shape, lr, steps, seed + i, master_init)
        old[name], new[name] = versions[0], versions[steps]
    return old, new, dims


def demo_policy_model(lr: float, steps: int, seed: int = 0) -> tuple[dict, dict]:
    """(v0, v{steps}) of the demo's own policy shape (rose/models/build.py: Qwen3, hidden 128,
    4 layers, vocab 768, ~0.9M params = 1.7 MB bf16), each tensor trained as in (b)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rose.models.build import BuildSpec

    d = BuildSpec().policy
    config = Qwen3Config(vocab_size=BuildSpec().vocab_size, hidden_size=d.hidden,
                         num_hidden_layers=d.layers, num_attention_heads=d.heads,
                         num_key_value_heads=d.kv_heads, head_dim=d.head_dim,
                         intermediate_size=d.intermediate, tie_word_embeddings=d.tied)
    with torch.device("meta"):
        shapes = [(n, tuple(p.shape)) for n, p in Qwen3ForCausalLM(config).named_parameters()]
    old, new = {}, {}
    for i, (name, shape) in enumerate(shapes):
        versions = adamw_versions(name, shape, lr, steps, seed + i)
        old[name], new[name] = versions[0], versions[steps]
    return old, new


# ---- (a) grpo checkpoints ------------------------------------------------------------------
def _load_bf16(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else [Path(path)]
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update({n: t.to(torch.bfloat16).contiguous() for n, t in load_file(str(f)).items()})
    return out


def find_grpo_run(data_dir: Path) -> Path | None:
    """The newest run under <data>/runs with at least two versions (checkpoints, or one
    checkpoint at step 1 plus the policy model)."""
    runs = []
    for ckpts in Path(data_dir).glob("runs/*/checkpoints"):
        steps = [int(m.group(1)) for p in ckpts.iterdir() if (m := _STEP_DIR.match(p.name))]
        if len(steps) >= 2 or steps == [1]:
            runs.append((ckpts.stat().st_mtime, ckpts.parent))
    return max(runs)[1] if runs else None


def grpo_versions(run_dir: Path, policy_dir: Path | None) -> list[tuple[int, dict]]:
    """(version, bf16 weights) for each checkpoint of the run, with v0 first when it can be
    read from the policy directory; only tensors every version holds."""
    ckpts = Path(run_dir) / "checkpoints"
    steps = sorted(int(m.group(1)) for p in ckpts.iterdir() if (m := _STEP_DIR.match(p.name)))
    versions = [(s, _load_bf16(ckpts / f"step-{s:08d}" / "model.safetensors")) for s in steps]
    if steps and steps[0] == 1 and policy_dir is not None and Path(policy_dir).is_dir():
        versions.insert(0, (0, _load_bf16(policy_dir)))
    common = set.intersection(*(set(w) for _, w in versions)) if versions else set()
    return [(v, {n: w[n] for n in sorted(common)}) for v, w in versions]


def model_config(path: Path) -> dict:
    import json

    return json.loads((Path(path) / "config.json").read_text())


def pairs(versions: list[tuple[int, dict]]) -> Iterator[tuple[str, dict, dict]]:
    for (a, old), (b, new) in zip(versions, versions[1:]):
        yield f"v{a}->v{b}", old, new


def numel(weights: dict[str, torch.Tensor]) -> int:
    return sum(math.prod(t.shape) for t in weights.values())
