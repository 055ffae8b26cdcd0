"""zstd with per-thread contexts and exact-size decompression (a size lie is corruption)."""

from __future__ import annotations

import threading

import zstandard

_local = threading.local()


def compress(data, level: int = 1) -> bytes:
    """One zstd frame (with its content size) of any contiguous buffer."""
    cache = _local.__dict__.setdefault("compressors", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level].compress(data)


def decompress(data: bytes | memoryview, size: int) -> bytes:
    """Decompress a frame that must hold exactly `size` bytes; ValueError otherwise."""
    if not hasattr(_local, "decompressor"):
        _local.decompressor = zstandard.ZstdDecompressor()
    try:
        out = _local.decompressor.decompress(data, max_output_size=max(size, 1))
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd frame does not decompress: {exc}") from exc
    if len(out) != size:
        raise ValueError(f"zstd frame holds {len(out)} bytes, expected {size}")
    return out
