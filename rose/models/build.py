"""Build the local models: a warmed-up Qwen3 policy and a heterogeneous Qwen2 serving model.

No hub exists here, so everything is made from scratch, deterministically from the seed:
tokenizer trained on environment text, policy initialised and warmed up on demonstrations,
serving model randomly initialised with other dims (it only has to generate, for the
co-serving work). Each directory carries `rose_build.json`; a build with the same spec is
skipped. Directories are written to a temp dir and renamed, so a crash loses nothing.

    python -m rose.models.build [--force]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from envs.registry import make_env
from core.config import ModelsConfig
from core.chat import ChatTokens
from rose.models.demos import corpus, demonstrations
from rose.models.tokenizer import train_tokenizer
from rose.models.warmup import WarmupSpec, warmup

BUILD_VERSION = 2  # bump when the build recipe changes in a way the spec does not show
MARKER = "rose_build.json"
# Demonstrations of the environments only built when ModelsConfig.demo_envs names them (so the
# default build keeps its time and digest): Sokoban's episodes are 10-50 turns long.
OPT_IN_DEMOS = {"sokoban": 400, "sokoban_easy": 400}
# One thread: float reductions (so the weights) are then the same on every machine, and on 2
# busy cores a second OpenMP thread mostly spin-waits (measured 5-10x slower, not faster).
BUILD_THREADS = 1
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


@dataclass(frozen=True)
class Dims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool = True

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim not in VLLM_CPU_HEAD_DIMS:
            raise ValueError(f"head_dim {self.head_dim} is not one vLLM's CPU attention supports {VLLM_CPU_HEAD_DIMS}")


@dataclass(frozen=True)
class BuildSpec:
    """What a build produces; tests pass a tiny one (production uses the defaults)."""

    vocab_size: int = 768  # upper bound: BPE stops early when the env text runs out of merges
    policy: Dims = Dims(hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, intermediate=384)
    serving: Dims = Dims(hidden=192, layers=3, heads=6, kv_heads=2, head_dim=32, intermediate=512, tied=False)
    max_positions: int = 2048
    # per environment of ModelsConfig.demo_envs; an opt-in one missing here gets OPT_IN_DEMOS'
    demo_episodes: dict = field(default_factory=lambda: {"frozenlake": 2000, "guess": 800})
    noise: float = 0.1  # fraction of demonstration turns with a random move (0.1: ~30% success)
    warmup: WarmupSpec = field(default_factory=WarmupSpec)

    def __post_init__(self) -> None:
        if self.serving.hidden != self.serving.heads * self.serving.head_dim:
            raise ValueError("Qwen2 derives head_dim as hidden / heads: serving dims disagree")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {self.noise}")

    def digest(self, seed: int) -> str:
        """Hash of everything the output depends on, including what the envs show the model."""
        probe = {}
        for name in sorted(self.demo_episodes):
            env = make_env(name)
            probe[name] = [env.system_prompt, env.reset(0), env.expert_reply()]
        blob = json.dumps([BUILD_VERSION, BUILD_THREADS, seed, asdict(self), probe], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _is_built(path: Path, kind: str, digest: str) -> bool:
    try:
        meta = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("kind") == kind and meta.get("digest") == digest and (path / "config.json").is_file()


def _publish(tmp: Path, dest: Path) -> None:
    """Swap `tmp` into `dest`; the old build is removed only once the new one is in place."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _config(arch: str, dims: Dims, spec: BuildSpec, chat: ChatTokens, vocab: int):
    from transformers import Qwen2Config, Qwen3Config

    cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config}[arch]
    return cls(
        vocab_size=vocab, hidden_size=dims.hidden, num_hidden_layers=dims.layers,
        num_attention_heads=dims.heads, num_key_value_heads=dims.kv_heads, head_dim=dims.head_dim,
        intermediate_size=dims.intermediate, max_position_embeddings=spec.max_positions,
        tie_word_embeddings=dims.tied, bos_token_id=None, eos_token_id=chat.eos_id,
        pad_token_id=chat.pad_id, use_cache=True,
    )


def _save(model, tokenizer, chat: ChatTokens, out: Path, meta: dict) -> None:
    from transformers import GenerationConfig

    out.mkdir(parents=True)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(eos_token_id=chat.eos_id, pad_token_id=chat.pad_id)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"  # the pre-5.x key, still read by older loaders
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / MARKER).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def _build_one(kind: str, spec: BuildSpec, seed: int, tokenizer, demos, dest: Path, digest: str) -> dict:
    from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM

    chat = ChatTokens(tokenizer)
    arch, dims, cls = (("qwen3", spec.policy, Qwen3ForCausalLM) if kind == "policy"
                       else ("qwen2", spec.serving, Qwen2ForCausalLM))
    torch.manual_seed(seed if kind == "policy" else seed + 1)
    model = cls(_config(arch, dims, spec, chat, len(tokenizer))).float()
    stats = warmup(model, chat, demos, spec.warmup, seed) if kind == "policy" else {}
    meta = {"kind": kind, "digest": digest, "seed": seed, "arch": cls.__name__,
            "params": sum(p.numel() for p in model.parameters()), "warmup": stats}
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        _save(model, tokenizer, chat, tmp, meta)
        _publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def for_envs(spec: BuildSpec, envs: list[str]) -> BuildSpec:
    """`spec` with demonstrations of exactly `envs` (counts from the spec, else OPT_IN_DEMOS)."""
    counts = {**OPT_IN_DEMOS, **spec.demo_episodes}
    missing = sorted(set(envs) - set(counts))
    if missing:
        raise ValueError(f"no demonstration count for {missing}; known: {sorted(counts)}")
    return replace(spec, demo_episodes={e: counts[e] for e in sorted(envs)})


def build_models(cfg: ModelsConfig, force: bool = False, spec: BuildSpec | None = None) -> tuple[Path, Path]:
    """Build (or find already built) the policy and serving model directories."""
    spec = for_envs(spec or BuildSpec(), cfg.demo_envs)
    policy, serving = cfg.policy_path(), cfg.serving_path()
    digest = spec.digest(cfg.seed)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" bars, per tiny file
    todo = [(k, p) for k, p in (("policy", policy), ("serving", serving)) if force or not _is_built(p, k, digest)]
    if not todo:
        return policy, serving
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        demos = demonstrations(spec.demo_episodes, spec.noise, cfg.seed)
        tokenizer = train_tokenizer(corpus(demos), spec.vocab_size)
        for kind, path in todo:
            path.parent.mkdir(parents=True, exist_ok=True)
            _build_one(kind, spec, cfg.seed, tokenizer, demos if kind == "policy" else [], path, digest)
    finally:
        torch.set_num_threads(threads)
    return policy, serving


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build the local policy and serving models.")
    ap.add_argument("--force", action="store_true", help="rebuild even if already built")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    policy, serving = build_models(ModelsConfig(seed=args.seed), force=args.force)
    for p in (policy, serving):
        meta = json.loads((p / MARKER).read_text())
        print(f"{meta['kind']:8s} {meta['arch']:18s} {meta['params']:>9,d} params  {p}")
    print(f"done in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
