"""Weight transfer benchmark (issue 3), codec part: bytes and speed of one publish's deltas.

Methods, side by side on the same (base, new) bf16 tensor pairs:
  dense      the raw bits of every tensor
  coo_int32  int32 index + bf16 value per changed element (the ROSE paper's sparse format)
  xor_zstd1  new XOR base, zstd level 1, single thread (slime's delta scheme)
  ours       storage.delta.encode_delta: per tensor the smallest of ef (Elias-Fano positions +
             coded value differences), ternary (2-bit symbol per element), xor_zstd, coo, dense;
             with header and checksums
The entropy bound (storage/delta/entropy.py) is summed over tensors: n*H(p) for positions plus
the order-0 entropy of the changed values' bit-pattern differences. Speeds are GB/s of dense
bytes over the summed per-tensor encode or decode times, measured as CPU time of the (single)
calling thread, since other jobs share this machine; wall times are in the JSON too. Every
decode is checked bit-exact.

Workloads:
  (b) synthetic: a Qwen2.5-0.5B-shaped model (names and shapes from transformers' Qwen2Config:
      hidden 896, 24 layers, MLP 4864, 14/2 heads, vocab 151936, tied embeddings; 494M params),
      processed one tensor at a time. fp32 master weights ~ N(0, 0.02) (norm weights 1 + N(0,
      0.1)), off the bf16 grid as in mid-training (--master-init bf16 starts from a bf16
      checkpoint instead). Fresh torch AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0.01) at
      each --lrs value; gradients g = s_t * r_row * N(0, 1), redrawn every step, with a per-tensor
      scale s_t log-uniform in [1e-4, 1e-2] and a per-row scale r_row = exp(N(0, 0.5)). The
      published bf16 tensor after 0 steps is the base; after k steps (--steps) the new version.
  (a) --checkpoints DIR1 DIR2: every tensor present in both safetensors model directories.

    .venv/bin/python bench/transfer.py [--params 494e6] [--lrs 1e-6 1e-5] [--steps 1 3]
    .venv/bin/python bench/transfer.py --checkpoints ckpt/step_10 ckpt/step_11 --no-synthetic
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from storage.delta import apply_delta, encode_delta, entropy_bound, read_header  # noqa: E402
from storage.delta import encodings as enc  # noqa: E402
from storage.delta.bits import to_bits  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
QWEN_0_5B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                 num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 tie_word_embeddings=True)


# ---- codec methods -------------------------------------------------------------------------

@dataclass(frozen=True)
class Method:
    name: str
    encode: Callable[[torch.Tensor, torch.Tensor, str], bytes]
    decode: Callable[[bytes, torch.Tensor], np.ndarray]  # -> flat bit patterns of new


def _coo_encode(new: torch.Tensor, base: torch.Tensor, name: str) -> bytes:
    nu, bu = to_bits(new), to_bits(base)
    return enc.encode_coo(np.flatnonzero(nu != bu), nu)


METHODS = [
    Method("dense", lambda new, base, name: to_bits(new).tobytes(),
           lambda blob, base: np.frombuffer(blob, to_bits(base).dtype).copy()),
    Method("coo_int32", _coo_encode,
           lambda blob, base: enc.decode_coo(memoryview(blob), to_bits(base))),
    Method("xor_zstd1", lambda new, base, name: enc.encode_xor_zstd(to_bits(new), to_bits(base)),
           lambda blob, base: enc.decode_xor_zstd(memoryview(blob), to_bits(base))),
    Method("ours", lambda new, base, name: encode_delta(new, base, name=name, base_version=0,
                                                        target_version=1),
           lambda blob, base: to_bits(apply_delta(blob, base, base_version=0))),
]


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
    numel: int = 0
    changed: int = 0
    dense_bytes: int = 0
    position_bits: float = 0.0
    value_bits: float = 0.0
    methods: dict[str, MethodTotals] = field(default_factory=lambda: {m.name: MethodTotals()
                                                                        for m in METHODS})
    ours_encodings: Counter = field(default_factory=Counter)
    tensors: list[dict] = field(default_factory=list)

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
    for method in METHODS:
        enc_s = dec_s = enc_wall = dec_wall = math.inf
        for _ in range(repeat):
            w0, c0 = time.perf_counter(), time.thread_time()
            blob = method.encode(new, base, name)
            w1, c1 = time.perf_counter(), time.thread_time()
            got = method.decode(blob, base)
            w2, c2 = time.perf_counter(), time.thread_time()
            enc_s, dec_s = min(enc_s, c1 - c0), min(dec_s, c2 - c1)
            enc_wall, dec_wall = min(enc_wall, w1 - w0), min(dec_wall, w2 - w1)
        if not np.array_equal(got, want):
            raise AssertionError(f"{method.name} did not round-trip {name} bit-exactly")
        totals = result.methods[method.name]
        totals.bytes += len(blob)
        totals.encode_s += enc_s
        totals.decode_s += dec_s
        totals.encode_wall_s += enc_wall
        totals.decode_wall_s += dec_wall
        row[f"{method.name}_bytes"] = len(blob)
        row[f"{method.name}_encode_s"] = enc_s
        row[f"{method.name}_decode_s"] = dec_s
        if method.name == "ours":
            row["ours_encoding"] = read_header(blob).encoding
            result.ours_encodings[row["ours_encoding"]] += 1
    result.tensors.append(row)


# ---- workload (b): AdamW on a Qwen-shaped model ----------------------------------------------

def qwen_shapes(params: float) -> tuple[list[tuple[str, tuple[int, ...]]], dict]:
    """Parameter names and shapes of Qwen2.5-0.5B, cut to about `params` parameters
    (fewer layers first, then a smaller vocabulary)."""
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


def _count(dims: dict) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**dims))
    return sum(p.numel() for p in model.parameters())


def adamw_versions(name: str, shape: tuple[int, ...], lr: float, steps: int, seed: int,
                   master_init: str) -> list[torch.Tensor]:
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


def run_synthetic(params: float, lrs: list[float], steps: list[int], seed: int,
                  master_init: str, repeat: int, console: Console) -> tuple[list[CaseResult], dict]:
    shapes, dims = qwen_shapes(params)
    total = sum(math.prod(s) for _, s in shapes)
    console.print(f"synthetic: {len(shapes)} tensors, {total / 1e6:.1f}M params, "
                  f"{dims['num_hidden_layers']} layers, vocab {dims['vocab_size']}")
    cases = {(lr, k): CaseResult(f"adamw lr={lr:g} steps={k}") for lr in lrs for k in steps}
    t0 = time.perf_counter()
    for i, (name, shape) in enumerate(shapes):
        for lr in lrs:
            versions = adamw_versions(name, shape, lr, max(steps), seed + i, master_init)
            for k in steps:
                measure_pair(cases[(lr, k)], name, versions[0], versions[k], repeat)
            del versions
        if i % 40 == 0:
            console.print(f"  [{i + 1}/{len(shapes)}] {name} {shape}  "
                          f"{time.perf_counter() - t0:.0f}s", highlight=False)
    return list(cases.values()), {"params": total, "dims": dims, "master_init": master_init}


# ---- workload (a): two checkpoints ---------------------------------------------------------

def checkpoint_pairs(old_dir: Path,
                     new_dir: Path) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, old, new) for every tensor both safetensors directories hold with equal shape."""
    from safetensors import safe_open

    def index(d: Path) -> dict[str, Path]:
        files = sorted(Path(d).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {d}")
        out = {}
        for f in files:
            with safe_open(str(f), "pt") as st:
                out.update({k: f for k in st.keys()})
        return out

    old_index, new_index = index(old_dir), index(new_dir)
    unmatched = sorted(old_index.keys() ^ new_index.keys())
    if unmatched:
        print(f"skipping {len(unmatched)} tensors present in only one checkpoint: "
              f"{', '.join(unmatched[:5])}{' ...' if len(unmatched) > 5 else ''}")
    for name in sorted(old_index.keys() & new_index.keys()):
        with safe_open(str(old_index[name]), "pt") as a, safe_open(str(new_index[name]), "pt") as b:
            old, new = a.get_tensor(name), b.get_tensor(name)
        if old.shape == new.shape and old.dtype == new.dtype:
            yield name, old, new
        else:
            print(f"skipping {name}: {old.dtype}{tuple(old.shape)} -> "
                  f"{new.dtype}{tuple(new.shape)}")


def run_checkpoints(old_dir: Path, new_dir: Path, repeat: int) -> CaseResult:
    result = CaseResult(f"checkpoints {Path(old_dir).name} -> {Path(new_dir).name}")
    for name, old, new in checkpoint_pairs(old_dir, new_dir):
        measure_pair(result, name, old, new, repeat)
    return result


# ---- report --------------------------------------------------------------------------------

def print_table(console: Console, summaries: list[dict]) -> None:
    table = Table(title="Weight delta codec: bytes per publish, speed (GB/s of dense bytes, "
                        "1 thread, CPU time)")
    for col in ("case", "density", "method", "MB", "x bound", "x smaller than dense",
                "encode GB/s", "decode GB/s"):
        table.add_column(col, justify="left" if col in ("case", "method") else "right")
    for s in summaries:
        table.add_row(s["case"], f"{s['density']:.2%}", "entropy bound",
                      f"{s['bound_bytes'] / 1e6:.3f}", "1.00",
                      f"{s['dense_bytes'] / max(s['bound_bytes'], 1):.1f}", "", "")
        for name, m in s["methods"].items():
            table.add_row("", "", name, f"{m['bytes'] / 1e6:.3f}", f"{m['ratio_to_bound']:.2f}",
                          f"{m['compression_vs_dense']:.1f}", f"{m['encode_gbps']:.2f}",
                          f"{m['decode_gbps']:.2f}")
        table.add_section()
    console.print(table)
    for s in summaries:
        ours, xor = s["methods"]["ours"], s["methods"]["xor_zstd1"]
        picks = ", ".join(f"{k} x{v}" for k, v in sorted(s["ours_encodings"].items()))
        console.print(f"{s['case']}: ours {ours['ratio_to_bound']:.2f}x bound (target <= 1.25), "
                      f"encode {ours['encode_gbps'] / xor['encode_gbps']:.2f}x xor_zstd1's speed "
                      f"(target >= 1); tensors by encoding: {picks}", highlight=False)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=494e6,
                        help="synthetic model size; default the full Qwen2.5-0.5B shape (494M)")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--master-init", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="best of N timings per tensor")
    parser.add_argument("--checkpoints", type=Path, nargs=2, metavar=("OLD_DIR", "NEW_DIR"))
    parser.add_argument("--no-synthetic", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "transfer_codec.json")
    args = parser.parse_args()

    console = Console() if sys.stdout.isatty() else Console(width=120)
    results, config = [], {}
    if args.checkpoints:
        results.append(run_checkpoints(*args.checkpoints, args.repeat))
    if not args.no_synthetic:
        cases, config = run_synthetic(args.params, args.lrs, args.steps, args.seed,
                                      args.master_init, args.repeat, console)
        results.extend(cases)
    summaries = [r.summary() for r in results]
    print_table(console, [{k: v for k, v in s.items() if k != "tensors"} for s in summaries])
    write_json(args.out, {"bench": "transfer_codec", "machine": platform.platform(),
                          "cpus": os.cpu_count(),
                          "args": {k: str(v) for k, v in vars(args).items()},
                          "synthetic": config, "cases": summaries})
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
