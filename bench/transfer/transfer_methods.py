"""The methods bench/transfer/transfer.py compares, and per-case totals (see its docstring)."""
from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from storage.delta import apply_delta, encode_delta, entropy_bound, read_header
from storage.delta import encodings as enc
from storage.delta.bits import to_bits


@dataclass(frozen=True)
class Method:
    name: str
    encode: Callable[[torch.Tensor, torch.Tensor, str], Any]  # -> payload
    decode: Callable[[Any, torch.Tensor], np.ndarray]  # -> flat bit patterns of new
    nbytes: Callable[[Any], int] = len
    prepare: Callable[[str, torch.Tensor], None] | None = None  # untimed (e.g. planning)


def _coo_encode(new: torch.Tensor, base: torch.Tensor, name: str) -> bytes:
    nu, bu = to_bits(new), to_bits(base)
    return enc.encode_coo(np.flatnonzero(nu != bu), nu)


def codec_methods(shard: Method | None = None) -> list[Method]:
    methods = [Method("dense", lambda new, base, name: to_bits(new).tobytes(),
                      lambda blob, base: np.frombuffer(blob, to_bits(base).dtype).copy())]
    if shard is not None:
        methods.append(shard)
    return methods + [
        Method("coo_int32", _coo_encode,
               lambda blob, base: enc.decode_coo(memoryview(blob), to_bits(base))),
        Method("xor_zstd1",
               lambda new, base, name: enc.encode_xor_zstd(to_bits(new), to_bits(base)),
               lambda blob, base: enc.decode_xor_zstd(memoryview(blob), to_bits(base))),
        Method("ours", lambda new, base, name: encode_delta(new, base, name=name,
                                                            base_version=0, target_version=1),
               lambda blob, base: to_bits(apply_delta(blob, base, base_version=0)))]


def shard_method(dims: dict, trainer_tp: int, server_tp: int) -> Method:
    """Dense slices by shard plan: the trainer's distinct TP shards are published once each;
    the receiver's ranks copy out exactly the boxes they hold (storage/shards/plan.py). Plans
    are made untimed (once per tensor: a real system makes them once per model)."""
    from storage.shards.layout import ParallelLayout, shard_key, slice_for
    from storage.shards.plan import ParamSpec, apply_pull, assemble, pull_plan, split_full
    from storage.shards.rules import infer_rule

    trainer, server = ParallelLayout(trainer_tp), ParallelLayout(server_tp)
    layers = int(dims.get("num_hidden_layers", 1))
    tied = bool(dims.get("tie_word_embeddings", True))
    plans: dict[tuple[str, tuple], tuple] = {}

    def prepare(name: str, new: torch.Tensor) -> None:
        key = (name, tuple(new.shape))
        if key not in plans:
            rule = infer_rule(name, key[1], model_cfg=dims)
            spec = ParamSpec(name, key[1], rule, new.element_size())
            plan = pull_plan([spec], server, trainer, num_layers=layers, tied=tied)
            keys = [shard_key(name, rule, slice_for(rule, key[1], t, trainer_tp), 0)
                    for t in range(trainer_tp)]
            plans[key] = (rule, plan, keys)

    def encode(new: torch.Tensor, base: torch.Tensor, name: str) -> dict:
        rule, plan, keys = plans[(name, tuple(new.shape))]
        shards = split_full(new, rule, trainer)  # what the trainer's TP ranks hold
        published = dict(zip(keys, shards))  # replicas share a key: each slice once
        return {"rule": rule, "plan": plan, "published": published, "shape": tuple(new.shape),
                "bytes": sum(pc.nbytes for rank in plan for pc in plan[rank])}

    def decode(payload: dict, base: torch.Tensor) -> np.ndarray:
        plan, name = payload["plan"], None
        locals_ = [apply_pull(plan[rank], payload["published"].__getitem__)
                   for rank in sorted(plan)]
        name = next(iter(locals_[0]), None)
        if name is None:  # an empty tensor: nothing to pull
            return to_bits(base.clone())
        shards = [loc[name] for loc in locals_]
        full = assemble(shards, payload["rule"], payload["shape"]) if len(shards) > 1 \
            else shards[0]
        return to_bits(full)

    return Method(f"shard_only_tp{trainer_tp}to{server_tp}", encode, decode,
                  lambda payload: payload["bytes"], prepare)


@dataclass
class MethodTotals:
    bytes: int = 0
    encode_s: float = 0.0  # CPU time of the calling thread (robust to other load on the box)
    decode_s: float = 0.0
    encode_wall_s: float = 0.0
    decode_wall_s: float = 0.0


@dataclass
class CaseResult:
    case: str
    method_list: list[Method]
    numel: int = 0
    changed: int = 0
    dense_bytes: int = 0
    position_bits: float = 0.0
    value_bits: float = 0.0
    methods: dict[str, MethodTotals] = field(default_factory=dict)
    ours_encodings: Counter = field(default_factory=Counter)
    tensors: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.methods = {m.name: MethodTotals() for m in self.method_list}

    def summary(self) -> dict:
        bound = (self.position_bits + self.value_bits) / 8
        out = {"case": self.case, "numel": self.numel, "changed": self.changed,
               "density": self.changed / max(self.numel, 1), "dense_bytes": self.dense_bytes,
               "bound_bytes": bound, "bound_position_bytes": self.position_bits / 8,
               "bound_value_bytes": self.value_bits / 8,
               "ours_encodings": dict(self.ours_encodings), "methods": {}}
        for name, t in self.methods.items():
            out["methods"][name] = {
                "bytes": t.bytes, "ratio_to_bound": t.bytes / bound if bound else math.inf,
                "compression_vs_dense": self.dense_bytes / max(t.bytes, 1),
                "encode_s": t.encode_s, "decode_s": t.decode_s,
                "encode_wall_s": t.encode_wall_s, "decode_wall_s": t.decode_wall_s,
                "encode_gbps": self.dense_bytes / t.encode_s / 1e9 if t.encode_s else math.inf,
                "decode_gbps": self.dense_bytes / t.decode_s / 1e9 if t.decode_s else math.inf}
        ours, xor = out["methods"]["ours"], out["methods"]["xor_zstd1"]
        out["targets"] = {"ours_within_1.25x_bound": ours["ratio_to_bound"] <= 1.25,
                          "ours_encode_at_least_xor_zstd1": ours["encode_s"] <= xor["encode_s"]}
        out["tensors"] = self.tensors
        return out


def measure_pair(result: CaseResult, name: str, base: torch.Tensor, new: torch.Tensor,
                 repeat: int = 1) -> None:
    """Run every method on one tensor pair, check bit-exactness, add to the case totals."""
    want = to_bits(new)
    bound = entropy_bound(new, base)
    result.numel += bound.numel
    result.changed += bound.changed
    result.dense_bytes += want.nbytes
    result.position_bits += bound.position_bits
    result.value_bits += bound.value_bits
    row = {"name": name, "numel": bound.numel, "density": bound.density,
           "bound_bytes": bound.bits / 8}
    for method in result.method_list:
        if method.prepare is not None:
            method.prepare(name, new)
        enc_s = dec_s = enc_wall = dec_wall = math.inf
        for _ in range(repeat):
            w0, c0 = time.perf_counter(), time.process_time()  # blocks: other threads
            payload = method.encode(new, base, name)
            w1, c1 = time.perf_counter(), time.process_time()
            got = method.decode(payload, base)
            w2, c2 = time.perf_counter(), time.process_time()
            enc_s, dec_s = min(enc_s, c1 - c0), min(dec_s, c2 - c1)
            enc_wall, dec_wall = min(enc_wall, w1 - w0), min(dec_wall, w2 - w1)
        if not np.array_equal(got, want):
            raise AssertionError(f"{method.name} did not round-trip {name} bit-exactly")
        totals = result.methods[method.name]
        size = method.nbytes(payload)
        totals.bytes += size
        totals.encode_s += enc_s
        totals.decode_s += dec_s
        totals.encode_wall_s += enc_wall
        totals.decode_wall_s += dec_wall
        row[f"{method.name}_bytes"] = size
        row[f"{method.name}_encode_s"] = enc_s
        row[f"{method.name}_decode_s"] = dec_s
        if method.name == "ours":
            row["ours_encoding"] = read_header(payload).encoding
            result.ours_encodings[row["ours_encoding"]] += 1
    result.tensors.append(row)
