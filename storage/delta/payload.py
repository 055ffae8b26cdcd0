"""One tensor's delta payload: choose the smallest encoding, and apply it only onto its base.

encode_delta compares new and base bit for bit and emits header + body (header.py). The chooser
finds what changed once and sizes coo / ef / dense exactly without encoding them; where many
elements changed (a sampled density, or the exact one of a small tensor) it encodes ternary,
which needs no position scan. Where the
changes are structured (gap entropy well below Elias-Fano's cost: rows, strides) it also tries
ternary, and xor_zstd when a sampled estimate says it could win. apply_delta returns
a new tensor and never touches the base; any doubt raises DeltaBaseMismatch or CorruptPayload,
and the receiver then asks for a full snapshot.
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash

from storage.delta import bits, elias_fano, encodings as enc, kernels, values, zstd_io
from storage.delta.errors import CorruptPayload, DeltaBaseMismatch
from storage.delta.header import DeltaHeader, unpack_header

ENCODINGS = tuple(enc.ENCODING_IDS)
# Elias-Fano and ternary cost the same near 15% density (AdamW deltas); above it ternary is
# smaller and needs no position scan, so a sampled density above it skips the scan.
_TERNARY_DENSITY = 0.15
_XOR_MARGIN = 0.9    # run xor_zstd in full only if its sampled estimate is 10% below the best
_XOR_MIN_WINDOW = 256  # sample windows narrower than this: the tensor is cheap to code whole
# Gap probe: 16 runs of 4096 consecutive positions. For independent positions an octave code
# of the gaps costs about what Elias-Fano does; 1.5 bits less per position means structure.
_GAP_SAMPLES, _GAP_RUN, _GAP_SLACK_BITS, _GAP_MIN = 16, 4096, 1.5, 256


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
        return force, enc.encode_xor_zstd(new, base)
    if force == "ternary":
        return force, enc.encode_ternary(new, base)
    n = new.size
    # sampled, or exact where the tensor is small enough to look at: a small tensor where
    # many elements moved then goes straight to ternary as a large one does (its change
    # scan and value coding cost several times the ternary encode)
    density = bits.estimated_density(new, base)
    # Candidates: exact sizes, with a recipe for the body (built only for the winner).
    candidates: dict[str, tuple[int, object]] = {"dense": (1 + new.nbytes, None)}
    structured = False
    if force is None and density >= _TERNARY_DENSITY:
        body = enc.encode_ternary(new, base)  # dense change: skip the position scan entirely
        candidates["ternary"] = (len(body), body)
    else:
        change = bits.changes(new, base, density, reuse=True)  # used up within this call
        k = change.positions.size
        if force == "coo":
            return force, enc.encode_coo(change.positions, new)
        value_blob = values.encode_values(change.diff)
        if force == "ef":
            return force, enc.encode_ef(change.positions, n, value_blob)
        if k == 0:
            return "ef", enc.encode_ef(change.positions, n, value_blob)
        coo = enc.coo_size(k, n, new.itemsize)
        if coo is not None:
            candidates["coo"] = (coo, lambda: enc.encode_coo(change.positions, new))
        candidates["ef"] = (enc.ef_size(k, n, value_blob),
                            lambda: enc.encode_ef(change.positions, n, value_blob))
        # Structured change sets (rows, strides) are where Elias-Fano leaves bits on the table
        # and the zstd-based encodings find runs; only then pay a full pass for them.
        structured = _looks_structured(change.positions, n)
        if structured or k >= _TERNARY_DENSITY * n:  # (or a small tensor / an off sample)
            body = enc.encode_ternary(new, base)
            candidates["ternary"] = (len(body), body)
    best = min(candidates, key=lambda name: candidates[name][0])
    best_size, recipe = candidates[best]
    try_xor = "ef" not in candidates or structured
    if try_xor:
        estimate, body = _xor_estimate(new, base)
        if estimate < _XOR_MARGIN * best_size:
            body = enc.encode_xor_zstd(new, base) if body is None else body
            if len(body) < best_size:
                return "xor_zstd", body
    if best == "dense":
        return best, enc.encode_dense(new, dense_level)
    return best, recipe() if callable(recipe) else recipe


def _xor_estimate(new: np.ndarray, base: np.ndarray) -> tuple[float, bytes | None]:
    """(xor_zstd body size, the body where it was built): from evenly spaced sample windows
    (zstd-1 looks back at most a window, so clustered changes show up in the samples), a
    quarter of a tensor below the usual sample's size, and exact for a tiny one (the body is
    then kept, not built twice). The trial costs more than the ternary encode it checks."""
    window = min(bits.SAMPLE_WINDOW, new.size // (4 * bits.SAMPLE_WINDOWS))
    rows = bits.sample_rows(new, window) if window >= _XOR_MIN_WINDOW else None
    if rows is None:
        body = enc.encode_xor_zstd(new, base)
        return len(body), body
    sample = (rows ^ bits.sample_rows(base, window)).reshape(-1)
    return len(zstd_io.compress(sample, 1)) * new.size / sample.size, None


def _looks_structured(positions: np.ndarray, n: int) -> bool:
    """True when the gaps between changes have much less entropy than independent positions
    would (runs along rows, strides), i.e. when Elias-Fano leaves bits on the table."""
    k = positions.size
    if k < _GAP_MIN:
        return False  # too few to tell, and too small to matter
    if k > _GAP_SAMPLES * _GAP_RUN:  # evenly spaced runs of consecutive positions
        starts, run = np.linspace(0, k - _GAP_RUN, _GAP_SAMPLES).astype(np.int64), _GAP_RUN
    else:
        starts, run = np.zeros(1, np.int64), k
    # Code each gap as its octave (entropy-coded) plus its offset inside the octave (verbatim):
    # few symbols, so a sample estimates it well, and within ~0.5 bit of the gap entropy.
    counts = kernels.gap_octaves(positions, starts, run)
    octaves = np.flatnonzero(counts)
    counts = counts[octaves]
    total = int(counts.sum())
    gap_bits = np.log2(total) - float(np.sum(counts * np.log2(counts))) / total
    gap_bits += float(np.sum(counts * octaves)) / total
    ef_bits = (elias_fano.encoded_size(k, n) - elias_fano.encoded_size(0, n)) * 8 / k
    return gap_bits < ef_bits - _GAP_SLACK_BITS


def read_header(payload: bytes | memoryview) -> DeltaHeader:
    """The verified header of a payload (name, versions, encoding, shape, sizes)."""
    return unpack_header(payload)


def apply_delta(payload: bytes | memoryview, base: torch.Tensor | None, *,
                base_version: int | None, in_place: bool = False) -> torch.Tensor:
    """The tensor the payload encodes, built from `base` (held by the receiver as `base_version`).

    Raises DeltaBaseMismatch when the payload needs another base than the one given, and
    CorruptPayload when the bytes are damaged. `base` is never modified, unless `in_place`
    (a contiguous CPU base of the payload's dtype and shape): the result is then written into
    `base`, which is returned, and no tensor-sized buffer is allocated for a sparse delta (fresh
    memory is what a pull pays most for: every page faults in). In place, an error raised after
    the header and body checks (a result checksum that differs: the base was not the sender's)
    may leave `base` partly written: its holder must treat it as no version.
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
    into = _in_place_target(head, base, where) if in_place else None
    try:
        if into is not None and head.encoding in ("ef", "ternary"):
            decode = enc.decode_ef if head.encoding == "ef" else enc.decode_ternary
            out = decode(body, into, in_place=True)
        elif head.encoding == "dense":
            out = enc.decode_dense(body, head.numel, udt)
        elif head.encoding == "xor_zstd":
            out = enc.decode_xor_zstd(body, base_u)
        elif head.encoding == "coo":
            out = enc.decode_coo(body, base_u)
        elif head.encoding == "ef":
            out = enc.decode_ef(body, base_u)
        else:
            out = enc.decode_ternary(body, base_u)
    except (ValueError, IndexError) as exc:
        raise CorruptPayload(f"{where}: {head.encoding} body does not decode: {exc}") from exc
    if into is not None and out is not into:  # decoded aside (rare encodings): copy it in
        np.copyto(into, out)
        out = into
    if xxhash.xxh3_64_intdigest(out) != head.result_checksum:
        # The body is intact (its checksum passed), so the base differs from the sender's.
        raise DeltaBaseMismatch(f"{where}: result checksum mismatch; the base's content differs "
                                "from the sender's base")
    return base if into is not None else bits.from_bits(out, head.dtype, head.shape)


def writable_base(base: torch.Tensor | None, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    """Whether apply_delta can write a `dtype` `shape` result into `base` (in_place=True)."""
    return base is not None and base.device.type == "cpu" and base.is_contiguous() \
        and base.dtype == dtype and tuple(base.shape) == tuple(shape)


def _in_place_target(head: DeltaHeader, base: torch.Tensor | None, where: str) -> np.ndarray:
    """The bits of `base` to decode into (the same memory), or ValueError."""
    if not writable_base(base, head.dtype, head.shape):
        raise ValueError(f"{where}: applying in place needs a contiguous CPU {head.dtype}"
                         f"{head.shape} tensor to write into")
    return bits.to_bits(base)


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
