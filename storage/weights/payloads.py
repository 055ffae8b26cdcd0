"""Payload encodings of published tensors: how a tensor becomes bucket bytes and back.

Each payload carries its `encoding` in the manifest entry's metadata, with dtype and shape:
"raw" (the tensor's bytes as they are in memory) or "rsdt" (a storage.delta payload: dense
snapshot or sparse delta, with its own base/target versions and result checksum); others are
added with register_decoder. The receiver's pipeline (storage/weights/apply_pipeline.py)
decodes through `decode_payload`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from storage.delta.apply import apply_delta, writable_base
from storage.relay.base import Buffer
from storage.weights.buckets import CorruptBucket

Encoder = Callable[[str, torch.Tensor], tuple[Buffer, dict[str, Any]]]
Decoder = Callable[[memoryview, dict[str, Any], "torch.Tensor | None", "int | None"], torch.Tensor]

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool)}


def raw_encoder(name: str, tensor: torch.Tensor) -> tuple[Buffer, dict[str, Any]]:
    """The tensor's bytes as they are in memory (any dtype in DTYPES)."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise ValueError(f"tensor {name!r} has unsupported dtype {tensor.dtype}")
    t = tensor.detach().to("cpu").contiguous().reshape(-1)
    data = t.view(torch.uint8).numpy() if t.numel() else b""
    return data, {"encoding": "raw", "dtype": dtype, "shape": list(tensor.shape)}


def _decode_raw(payload: memoryview, meta: dict[str, Any], base: torch.Tensor | None,
                base_version: int | None) -> torch.Tensor:
    dtype, shape = DTYPES[meta["dtype"]], meta["shape"]
    if payload.nbytes == 0:  # torch.frombuffer refuses empty buffers
        return torch.empty(shape, dtype=dtype)
    if payload.readonly:  # held tensors are written into by later deltas (in place)
        payload = memoryview(bytearray(payload))
    return torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(shape)


def _decode_rsdt(payload: memoryview, meta: dict[str, Any], base: torch.Tensor | None,
                 base_version: int | None) -> torch.Tensor:
    """A storage.delta payload: applied only onto its declared base (DeltaError otherwise)."""
    return apply_delta(payload, base, base_version=base_version)


_DECODERS: dict[str, Decoder] = {"raw": _decode_raw, "rsdt": _decode_rsdt}


def register_decoder(encoding: str, decoder: Decoder) -> None:
    """Teach pull_weights an encoding: decoder(payload, meta, base_tensor, base_version)."""
    _DECODERS[encoding] = decoder


def decode_payload(name: str, payload: memoryview, meta: dict[str, Any],
                   base: dict[str, torch.Tensor] | None, base_version: int | None,
                   in_place: bool = False) -> torch.Tensor:
    """The tensor `name` from its payload, checked against the manifest's shape and dtype;
    `base` / `base_version`: what the receiver holds, for a delta (CorruptBucket, DeltaError).
    `in_place`: a storage.delta payload is decoded into the base tensor itself (apply_delta)."""
    encoding = meta.get("encoding", "")
    decoder = _DECODERS.get(encoding)
    if decoder is None:
        raise CorruptBucket(f"tensor {name!r}: unknown encoding {meta.get('encoding')!r} "
                            f"(known: {', '.join(_DECODERS)})")
    held = (base or {}).get(name)
    if in_place and encoding == "rsdt" and writable_base(held, DTYPES.get(meta["dtype"]),
                                                         tuple(meta["shape"])):
        tensor = apply_delta(payload, held, base_version=base_version, in_place=True)
    else:
        tensor = decoder(payload, meta, held, base_version)
    dtype = str(tensor.dtype).removeprefix("torch.")
    if list(tensor.shape) != list(meta["shape"]) or dtype != meta["dtype"]:
        raise CorruptBucket(f"tensor {name!r} decoded as {tensor.dtype}{list(tensor.shape)}, "
                            f"manifest says {meta['dtype']}{meta['shape']}")
    return tensor


def entry_dtype(meta: dict[str, Any]) -> torch.dtype | None:
    """The dtype an entry's metadata names (None: not one a payload may carry)."""
    return DTYPES.get(meta.get("dtype", ""))


def shape_bytes(meta: dict[str, Any]) -> int:
    """Bytes of the tensor an entry's metadata describes (a decoding cost estimate)."""
    dtype = DTYPES.get(meta.get("dtype", ""), torch.uint8)
    n = 1
    for d in meta.get("shape", []):
        n *= int(d)
    return n * dtype.itemsize
