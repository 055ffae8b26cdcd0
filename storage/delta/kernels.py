"""Compiled kernels for the codec's per-element passes (numba, nogil: they run on every core).

Three passes touch every element or every change of a tensor, and numpy needs several
temporaries for each:
  scan   compare new with base and collect (position, new - base) of every changed element;
  pack   the changed positions as Elias-Fano low bits and unary high part (the changed
         values' symbols, both ways, are storage/delta/value_kernels.py's);
  apply  Elias-Fano positions + value differences written onto the base (or a copy of it).
The scan compares 64 elements into one bit mask (the compare loop vectorises) and visits only
the set bits (count-trailing-zeros), so a block with no change costs one compare pass and a
block with a few costs a few stores: 2.2x / 1.9x / 1.6x / 1.5x numpy's chunked flatnonzero
scan at 0.1 / 1 / 4.2 / 15% changed, one thread on this project's machine (bench/transfer/codec_scan.py,
results/codec_scan.json). The apply kernel decodes the positions straight into the scatter,
never building the position array: 1.1-2.1x numpy's decode-then-fancy-index add.

Kernels compile on first use, seconds per argument type, into numba's cache next to this file
(a later process loads them in about half a second; `make test` and `make demo` fill the
cache first, and publishers and receivers warm them up on a thread), and raise nothing: they
return an error code the caller turns into CorruptPayload, so a damaged payload never crashes
a worker.
"""
from __future__ import annotations

import threading

import numba
import numpy as np

from storage.delta import probe_kernels, ternary_kernels, value_kernels
from storage.delta.intrinsics import cttz as _cttz
from storage.delta.kernel_args import read_only as _ro

_BLOCK = 64


def _vllm_can_start_after_us() -> None:
    """vLLM's CPU platform, building an engine, scans every loaded module for objects whose
    vars() name a Triton kernel (vllm/triton_utils/dispatcher.py _rebind_kernels). llvmlite's
    library wrapper answers any attribute with a function wrapper, `__dict__` included, so
    vars() of it is no mapping and no engine can start in a process that imported numba first
    (a receiver decodes with these kernels, then the co-serving executor builds an engine).
    An empty `__dict__` for it answers the scan and changes nothing llvmlite uses."""
    from llvmlite.binding import ffi

    ffi.lib._fntab.setdefault("__dict__", {})


_vllm_can_start_after_us()


@numba.njit(nogil=True, cache=True)
def _scan(new: np.ndarray, base: np.ndarray, positions: np.ndarray, diff: np.ndarray,
          offset: int) -> tuple[int, int]:
    """Changes of `new` against `base` (which begin at element `offset` of the tensor) into
    `positions` / `diff` until done or full: (changes found, -1 when done, else the block to
    go on from). The caller grows the arrays and passes views to resume: growing them here,
    or indexing from a count passed in, makes the scan 2-3x slower (LLVM then cannot prove
    the indices non-negative, and keeps numba's wrap-around checks in the loop)."""
    n = new.size
    blocks = n // _BLOCK
    limit = positions.size - _BLOCK  # room for a whole block (or the tail) of changes
    k = 0
    for block in range(blocks):
        if k > limit:
            return k, block
        start = block * _BLOCK
        mask = np.uint64(0)
        for j in range(_BLOCK):
            mask |= np.uint64(new[start + j] != base[start + j]) << np.uint64(j)
        if mask == 0:
            continue
        while mask:
            i = start + np.int64(_cttz(mask))
            positions[k] = offset + i
            diff[k] = new[i] - base[i]
            k += 1
            mask &= mask - np.uint64(1)
    if k > limit:
        return k, blocks
    for i in range(blocks * _BLOCK, n):
        if new[i] != base[i]:
            positions[k] = offset + i
            diff[k] = new[i] - base[i]
            k += 1
    return k, -1


def _grown(array: np.ndarray, used: int) -> np.ndarray:
    bigger = np.empty(2 * array.size, array.dtype)
    bigger[:used] = array[:used]
    return bigger


# Per-thread scan output, reused from tensor to tensor: fresh memory is paid for page by page
# on first touch (~1 GB/s on this project's VM), a third of a 4%-dense scan's time. Kept up to
# SCRATCH_MAX_BYTES per thread; a larger scan's output is its own.
SCRATCH_MAX_BYTES = 64 << 20
_scratch = threading.local()


def scan_changes(new: np.ndarray, base: np.ndarray, density: float | None = None,
                 reuse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(sorted int64 positions, wrapped new - base) of every element whose bits differ.

    `density`: an estimate of the changed fraction, to size the output once (it grows if low).
    `reuse`: the result lives in this thread's scratch, valid until its next reuse scan (for
    an encoder that is done with the changes before it scans the next tensor).
    """
    capacity = int(new.size * min(1.0, 1.25 * density)) + 1024 if density is not None else 1024
    held = getattr(_scratch, "arrays", {}).get(new.dtype) if reuse else None
    if held is not None and held[0].size >= capacity:
        positions, diff = held
    else:
        positions, diff = np.empty(capacity, np.int64), np.empty(capacity, new.dtype)
    new, base = _ro(new), _ro(base)
    k, at = 0, 0
    while True:
        found, stop = _scan(new[at:], base[at:], positions[k:], diff[k:], at)
        k += found
        if stop < 0:
            break
        at += stop * _BLOCK  # the estimate was low: more room, and on from where it stopped
        positions, diff = _grown(positions, k), _grown(diff, k)
    if reuse and positions.size * (8 + diff.itemsize) <= SCRATCH_MAX_BYTES:
        if not hasattr(_scratch, "arrays"):
            _scratch.arrays = {}
        _scratch.arrays[new.dtype] = (positions, diff)
    return positions[:k], diff[:k]


@numba.njit(nogil=True, cache=True)
def _ef_pack(positions: np.ndarray, low: int, lows: np.ndarray, unary: np.ndarray) -> None:
    mask = (np.uint64(1) << np.uint64(low)) - np.uint64(1)
    width, six, one = np.uint64(low), np.uint64(6), np.uint64(1)
    for i in range(positions.size):  # unsigned indices: no wrap-around checks (see _scan)
        p = np.uint64(positions[i])
        if low:
            value = p & mask
            at = np.uint64(i) * width
            shift = at & np.uint64(63)
            lows[at >> six] |= value << shift
            if shift:
                lows[(at >> six) + one] |= value >> (np.uint64(64) - shift)
        bit = (p >> width) + np.uint64(i)
        unary[bit >> six] |= one << (bit & np.uint64(63))


def ef_pack(positions: np.ndarray, low: int, low_bytes: int, unary_bits: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """(packed low bits, unary high part) of sorted int64 `positions`, as elias_fano lays
    them out: LSB-first bit streams of `low_bytes` bytes and `unary_bits` bits, as uint8
    arrays (not copied to bytes: the payload is assembled once, storage/delta/parts.py)."""
    lows = np.zeros(low_bytes // 8 + 2, "<u8")
    unary = np.zeros(unary_bits // 64 + 1, "<u8")
    _ef_pack(_ro(np.asarray(positions, np.int64)), low, lows, unary)
    return lows.view(np.uint8)[:low_bytes], unary.view(np.uint8)[:(unary_bits + 7) // 8]


# Error codes of the apply kernel (turned into messages by `ef_apply`).
_OK, _COUNT, _ORDER, _RANGE = 0, 1, 2, 3
_ERRORS = {_COUNT: "high part holds another number of positions than the header says",
           _ORDER: "decoded positions are not increasing",
           _RANGE: "decoded positions are out of range"}


@numba.njit(nogil=True, cache=True)
def _ef_apply(out: np.ndarray, lows: np.ndarray, unary: np.ndarray, count: int, low: int,
              diff: np.ndarray) -> int:
    """out[p_i] += diff[i] for the Elias-Fano positions p_i (lows and unary as uint64 words)."""
    mask = (np.uint64(1) << np.uint64(low)) - np.uint64(1)
    k, previous, n = 0, -1, out.size
    for w in range(unary.size):
        word = unary[w]
        while word:
            bit = w * 64 + np.int64(_cttz(word))
            word &= word - np.uint64(1)
            if k >= count:
                return _COUNT
            position = (bit - k) << low
            if low:
                at = np.uint64(k * low)
                shift = at & np.uint64(63)
                value = lows[at >> np.uint64(6)] >> shift
                if shift:
                    value |= lows[(at >> np.uint64(6)) + np.uint64(1)] << (np.uint64(64) - shift)
                position |= np.int64(value & mask)
            if position <= previous:
                return _ORDER
            if position >= n:
                return _RANGE
            # unsigned indices: numba checks signed ones for wrap-around in the loop
            out[np.uint64(position)] += diff[np.uint64(k)]
            previous = position
            k += 1
    return _OK if k == count else _COUNT


def _words(data: memoryview, spare: int = 0) -> np.ndarray:
    """Little-endian uint64 words of `data`, zero-padded, with `spare` extra zero words."""
    return np.frombuffer(bytes(data) + bytes(-len(data) % 8 + 8 * spare), "<u8")


def ef_apply(base: np.ndarray, lows: memoryview, unary: memoryview, count: int, low: int,
             diff: np.ndarray, in_place: bool = False) -> np.ndarray:
    """`base` with `diff` added (wrapping) at the Elias-Fano positions (packed low bits `lows`,
    unary high part `unary`): a new array, or `base` itself written into when `in_place`.
    ValueError when the positions are malformed (in place: some may have been written)."""
    if low >= 64:
        raise ValueError(f"Elias-Fano low part of {low} bits is wider than a word")
    out = base if in_place else base.copy()
    code = _ef_apply(out, _ro(_words(lows, spare=1)), _ro(_words(unary)), count, low, _ro(diff))
    if code != _OK:
        raise ValueError(_ERRORS[code])
    return out


_warming: threading.Thread | None = None
_warm_lock = threading.Lock()


def warm_up() -> None:
    """Compile (or load from the on-disk cache) every kernel for 16- and 32-bit patterns (bf16,
    fp16, fp32), so the first publish or pull of a process does not pay for it."""
    for dtype in (np.uint16, np.uint32):
        base = np.zeros(4 * _BLOCK + 3, dtype)
        new = base.copy()
        new[[5, 100, len(new) - 1]] = 1
        positions, diff = scan_changes(new, base, 0.01)
        low = 5
        lows, unary = ef_pack(positions, low, (positions.size * low + 7) // 8,
                              positions.size + ((new.size - 1) >> low) + 1)
        ef_apply(base, memoryview(lows), memoryview(unary), positions.size, low, diff)
        value_kernels.warm_up(diff)
        ternary_kernels.warm_up(np.dtype(dtype))
    probe_kernels.warm_up()


def warm_up_in_background() -> None:
    """warm_up on a daemon thread, once per process (publishers and receivers start it)."""
    global _warming
    with _warm_lock:
        if _warming is None:
            _warming = threading.Thread(target=warm_up, name="rose-codec-warm-up", daemon=True)
            _warming.start()
