"""Shared by the weight-sync tests: a tiny training run publishing bf16 weights, bit-level
equality, and publishers whose snapshot servers stop at teardown."""
from __future__ import annotations

import pytest
import torch

from storage.weights.sparse_publisher import SparsePublisher


def bits(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and a[n].shape == b[n].shape and bits(a[n]) == bits(b[n])
        for n in a)


class Training:
    """fp32 masters nudged by small steps and published as bf16 (most elements keep their
    bf16 bits), plus odd members: special values, an empty tensor, an int counter."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.g = g
        self.master = {"model.embed_tokens.weight": 0.02 * torch.randn(300, 64, generator=g),
                       "model.layers.0.self_attn.q_proj.weight": 0.02 * torch.randn(64, 64, generator=g),
                       "model.layers.0.input_layernorm.weight": 1 + 0.1 * torch.randn(64, generator=g),
                       "model.layers.1.mlp.up_proj.weight": 0.02 * torch.randn(256, 64, generator=g),
                       "lm_head.bias": torch.zeros(0)}
        special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40])
        self.extra = {"model.special": special.to(torch.bfloat16),
                      "model.steps": torch.tensor([0], dtype=torch.int64)}

    def step(self, lr: float = 3e-4) -> None:
        for t in self.master.values():
            t.add_(lr * torch.randn(t.shape, generator=self.g).sign())
        self.extra["model.steps"] = self.extra["model.steps"] + 1

    def weights(self) -> dict[str, torch.Tensor]:
        return {**{n: t.to(torch.bfloat16) for n, t in self.master.items()},
                **{n: t.clone() for n, t in self.extra.items()}}


def run_name(ns: str) -> str:
    return ns.replace("/", "-")


@pytest.fixture
def served():
    """Publishers whose request server threads are stopped at teardown."""
    publishers: list[SparsePublisher] = []
    yield publishers
    for p in publishers:
        p.stop_server()


def count_hashed(monkeypatch) -> list[int]:
    """The sizes of the buffers content hashes are taken of from here on (appended as taken):
    storage/delta/content_hash.py's xxh3 calls, counted."""
    import xxhash

    import storage.delta.content_hash as ch

    hashed: list[int] = []

    class Counting:
        @staticmethod
        def xxh3_64_intdigest(data) -> int:
            hashed.append(memoryview(data).nbytes)
            return xxhash.xxh3_64_intdigest(data)
    monkeypatch.setattr(ch, "xxhash", Counting)
    return hashed
