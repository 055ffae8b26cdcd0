"""One tensor's delta payload: choose the smallest encoding, and apply it only onto its base.

encode_delta compares new and base bit for bit and emits header + body (header.py). The chooser
computes what changed once, sizes coo / ef / bitmap / dense exactly without encoding them, and
estimates xor_zstd from evenly spaced samples (running it in full only when the sample says it
could win: it only does where changes cluster). apply_delta returns a new tensor and never
touches the base; any doubt raises DeltaBaseMismatch or CorruptPayload, and the receiver then
asks for a full snapshot.
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash

from storage.delta import bits, encodings as enc, values
from storage.delta.errors import CorruptPayload, DeltaBaseMismatch
from storage.delta.header import DeltaHeader, unpack_header

ENCODINGS = tuple(enc.ENCODING_IDS)
_PROBE_WINDOW = 8192      # elements per sampled window for the xor_zstd estimate
_PROBE_WINDOWS = 16
_XOR_MARGIN = 0.9         # run xor_zstd in full only if its estimate is 10% below the best


def encode_delta(new: torch.Tensor, base: torch.Tensor | None, *, name: str,
                 base_version: int | None, target_version: int, force: str | None = None,
                 dense_level: int = 0) -> bytes:
    """Payload turning `base` (published as `base_version`) into `new` (`target_version`).

    With no base the payload is dense (a snapshot). `force` picks one encoding (tests, bench);
    `dense_level` > 0 zstd-compresses dense bodies (byte planes) at that level.
    """
    bits.check_dtype(new.dtype)
    if force is not None and force not in ENCODINGS:
        raise ValueError(f"unknown encoding {force!r}; choose from {ENCODINGS}")
    if base is not None:
        if base.shape != new.shape or base.dtype != new.dtype:
            raise ValueError(f"{name}: base {base.dtype}{tuple(base.shape)} does not match new "
                             f"{new.dtype}{tuple(new.shape)}; send a snapshot (base=None)")
        if base_version is None:
            raise ValueError(f"{name}: a delta against a base needs the base's version")
    elif force not in (None, "dense"):
        raise ValueError(f"{name}: encoding {force!r} needs a base tensor")
    new_u = bits.to_bits(new)
    encoding, body = _choose(new_u, None if base is None else bits.to_bits(base), force,
                             dense_level)
    header = DeltaHeader(
        name=name, encoding=encoding, dtype=new.dtype, shape=tuple(new.shape),
        numel=new_u.size, base_version=None if encoding == "dense" else base_version,
        target_version=target_version, result_checksum=xxhash.xxh3_64_intdigest(new_u),
        body_checksum=xxhash.xxh3_64_intdigest(body), body_length=len(body))
    return header.pack() + body


def _choose(new: np.ndarray, base: np.ndarray | None, force: str | None,
            dense_level: int) -> tuple[str, bytes]:
    if base is None or force == "dense":
        return "dense", enc.encode_dense(new, dense_level)
    if force == "xor_zstd":
        return "xor_zstd", enc.encode_xor_zstd(new, base)
    change = bits.changes(new, base)
    positions = change.positions
    if force == "coo":
        return "coo", enc.encode_coo(positions, new)
    value_blob = values.encode_values(change.diff)
    if force in ("ef", "bitmap"):
        return force, enc.encode_sparse(force, positions, new.size, value_blob, change.bitmap)
    n, k = new.size, positions.size
    sizes = {"dense": 1 + new.nbytes,  # raw; with dense_level > 0 the real body is smaller
             "coo": enc.coo_size(k, n, new.itemsize),
             "ef": 8 + enc.positions_size("ef", k, n) + len(value_blob),
             "bitmap": 8 + enc.positions_size("bitmap", k, n) + len(value_blob)}
    best_size, best = min((s, name) for name, s in sizes.items() if s is not None)
    if k and _xor_estimate(new, base) < _XOR_MARGIN * best_size:
        xor_body = enc.encode_xor_zstd(new, base)
        if len(xor_body) < best_size:
            return "xor_zstd", xor_body
    if best == "coo":
        return best, enc.encode_coo(positions, new)
    if best in ("ef", "bitmap"):
        return best, enc.encode_sparse(best, positions, n, value_blob, change.bitmap)
    return "dense", enc.encode_dense(new, dense_level)


def _xor_estimate(new: np.ndarray, base: np.ndarray) -> float:
    """xor_zstd body size, exact for small tensors, else from evenly spaced sample windows."""
    n = new.size
    if n <= 4 * _PROBE_WINDOW * _PROBE_WINDOWS:
        return len(enc.encode_xor_zstd(new, base))
    starts = np.linspace(0, n - _PROBE_WINDOW, _PROBE_WINDOWS).astype(np.int64)
    index = (starts[:, None] + np.arange(_PROBE_WINDOW)).reshape(-1)
    sample = len(enc.encode_xor_zstd(new[index], base[index]))
    return sample * n / index.size


def read_header(payload: bytes | memoryview) -> DeltaHeader:
    """The verified header of a payload (name, versions, encoding, shape, sizes)."""
    return unpack_header(payload)


def apply_delta(payload: bytes | memoryview, base: torch.Tensor | None, *,
                base_version: int | None) -> torch.Tensor:
    """The tensor the payload encodes, built from `base` (held by the receiver as `base_version`).

    Raises DeltaBaseMismatch when the payload needs another base than the one given, and
    CorruptPayload when the bytes are damaged. `base` is never modified.
    """
    buf = memoryview(payload)
    head = unpack_header(buf)
    where = f"{head.name} (v{head.base_version} -> v{head.target_version})"
    body = buf[head.header_length:]
    if len(body) != head.body_length:
        raise CorruptPayload(f"{where}: body is {len(body)} bytes, header says {head.body_length}"
                             + (" (truncated)" if len(body) < head.body_length else ""))
    if xxhash.xxh3_64_intdigest(body) != head.body_checksum:
        raise CorruptPayload(f"{where}: body checksum mismatch")
    base_u = _check_base(head, base, base_version, where)
    udt = bits.uint_dtype(head.dtype)
    try:
        if head.encoding == "dense":
            out = enc.decode_dense(body, head.numel, udt)
        elif head.encoding == "xor_zstd":
            out = enc.decode_xor_zstd(body, base_u)
        elif head.encoding == "coo":
            out = enc.decode_coo(body, base_u)
        else:
            out = enc.decode_sparse(head.encoding, body, base_u)
    except (ValueError, IndexError) as exc:
        raise CorruptPayload(f"{where}: {head.encoding} body does not decode: {exc}") from exc
    if xxhash.xxh3_64_intdigest(out) != head.result_checksum:
        # The body is intact (its checksum passed), so the base differs from the sender's.
        raise DeltaBaseMismatch(f"{where}: result checksum mismatch; the base's content differs "
                                "from the sender's base")
    return bits.from_bits(out, head.dtype, head.shape)


def _check_base(head: DeltaHeader, base: torch.Tensor | None, base_version: int | None,
                where: str) -> np.ndarray | None:
    if head.encoding not in enc.NEEDS_BASE:
        return None
    if base is None:
        raise DeltaBaseMismatch(f"{where}: payload is a delta but no base tensor was given")
    if base_version != head.base_version:
        raise DeltaBaseMismatch(f"{where}: payload applies to base v{head.base_version}, "
                                f"receiver holds v{base_version}")
    if base.dtype != head.dtype or tuple(base.shape) != head.shape:
        raise DeltaBaseMismatch(f"{where}: base is {base.dtype}{tuple(base.shape)}, payload "
                                f"needs {head.dtype}{head.shape}")
    return bits.to_bits(base)
