"""One tensor's delta payload: choose the smallest encoding (applied by apply.py).

encode_delta compares new and base bit for bit and emits header + body (header.py). The chooser
finds what changed once and sizes coo / ef / dense exactly without encoding them; where many
elements changed (a sampled density, or the exact one of a small tensor) it encodes ternary,
which needs no position scan. Where the
changes are structured (gap entropy well below Elias-Fano's cost: rows, strides) it also tries
ternary, and xor_zstd when a sampled estimate says it could win. A large tensor's delta is
chosen and coded block by block, on every core (blocks.py).
"""

from __future__ import annotations

import numpy as np
import torch

from storage.delta import (blocks, bits, elias_fano, encodings as enc, parts, probe_kernels,
                           values, zstd_io)
from storage.delta.content_hash import combine, composes, content_hash
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
                 dense_level: int = 0, density: float | None = None) -> memoryview:
    """Payload turning `base` (published as `base_version`) into `new` (`target_version`).

    With no base the payload is dense (a snapshot). `force` picks one encoding (tests, bench);
    `dense_level` > 0 zstd-compresses dense bodies (byte planes) at that level. `density`:
    bits.estimated_density of new against base when the caller already took it (it steers
    the chooser; a large tensor's blocks each take their own). The payload is a byte view,
    assembled once from the coders' pieces (parts.py).
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
    base_u = None if base is None else bits.to_bits(base)
    if base_u is not None and (force == "blocks" or force is None and blocks.splits(new_u.nbytes)):
        return parts.assemble(_blocks_payload(new_u, base_u, new.dtype, tuple(new.shape), name,
                                              base_version, target_version, dense_level))
    return parts.assemble(_payload(new_u, base_u, new.dtype, tuple(new.shape), name,
                                   base_version, target_version, force, dense_level,
                                   density=density))


def _payload(new_u: np.ndarray, base_u: np.ndarray | None, dtype: torch.dtype,
             shape: tuple[int, ...], name: str, base_version: int | None, target_version: int,
             force: str | None = None, dense_level: int = 0,
             coded: tuple[str, list] | None = None, result_checksum: int | None = None,
             density: float | None = None) -> list:
    """Header + body of one payload, as parts: the chooser's (or `coded`, an encoding and its
    body's parts)."""
    encoding, body = coded or _choose(new_u, base_u, force, dense_level, density)
    body = body if isinstance(body, list) else [body]
    header = DeltaHeader(
        name=name, encoding=encoding, dtype=dtype, shape=shape, numel=new_u.size,
        base_version=None if encoding == "dense" else base_version,
        target_version=target_version,
        result_checksum=content_hash(new_u) if result_checksum is None else result_checksum,
        body_checksum=parts.checksum(body), body_length=parts.nbytes(body))
    return [header.pack(), *body]


def _blocks_payload(new_u: np.ndarray, base_u: np.ndarray, dtype: torch.dtype,
                    shape: tuple[int, ...], name: str, base_version: int | None,
                    target_version: int, dense_level: int) -> list:
    """A large tensor's delta as blocks (blocks.py), each chosen and coded on its own thread.
    The whole tensor's checksum is its content hash, made of its blocks' result checksums
    (content_hash.py): its bits are hashed once, block by block."""
    spans = blocks.ranges(new_u.size, new_u.itemsize)

    def block(span: tuple[int, int]) -> tuple[int, list]:
        block_bits = new_u[span[0]:span[1]]
        checksum = content_hash(block_bits)
        return checksum, _payload(block_bits, base_u[span[0]:span[1]], dtype,
                                  (span[1] - span[0],), name, base_version, target_version,
                                  None, dense_level, result_checksum=checksum)
    coded = blocks.gather(blocks.submit(block, spans))
    whole = combine([c for c, _ in coded]) if blocks.splits(new_u.nbytes) and \
        composes(new_u.itemsize) else content_hash(new_u)  # (forced blocks: tests)
    body = blocks.pack_parts([s for s, _ in spans], [p for _, p in coded])
    return _payload(new_u, base_u, dtype, shape, name, base_version, target_version,
                    coded=("blocks", body), result_checksum=whole)


def _choose(new: np.ndarray, base: np.ndarray | None, force: str | None,
            dense_level: int, density: float | None = None) -> tuple[str, bytes | list]:
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
    density = bits.estimated_density(new, base) if density is None else density
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
        value_parts = values.encode_values_parts(change.diff)
        if force == "ef":
            return force, enc.ef_parts(change.positions, n, value_parts)
        if k == 0:
            return "ef", enc.ef_parts(change.positions, n, value_parts)
        coo = enc.coo_size(k, n, new.itemsize)
        if coo is not None:
            candidates["coo"] = (coo, lambda: enc.encode_coo(change.positions, new))
        candidates["ef"] = (enc.ef_size(k, n, parts.nbytes(value_parts)),
                            lambda: enc.ef_parts(change.positions, n, value_parts))
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
    gap_bits = probe_kernels.gap_bits(positions, _GAP_SAMPLES, _GAP_RUN)
    ef_bits = (elias_fano.encoded_size(k, n) - elias_fano.encoded_size(0, n)) * 8 / k
    return gap_bits < ef_bits - _GAP_SLACK_BITS


def read_header(payload: bytes | memoryview) -> DeltaHeader:
    """The verified header of a payload (name, versions, encoding, shape, sizes)."""
    return unpack_header(payload)


def coded_as(payload: bytes | memoryview, head: DeltaHeader | None = None) -> str:
    """How the payload's bytes are coded: its encoding, or for one in blocks the encoding of
    the blocks that hold most of its elements (what its coding and applying cost follows).
    `head`: its read_header, when the caller has it (a parse per tensor per publish)."""
    head = unpack_header(payload) if head is None else head
    if head.encoding != "blocks":
        return head.encoding
    covered: dict[str, int] = {}
    for start, end, sub in blocks.unpack(memoryview(payload)[head.header_length:], head.numel):
        encoding = unpack_header(sub).encoding
        covered[encoding] = covered.get(encoding, 0) + end - start
    return max(covered, key=covered.__getitem__)
