"""Lossless sparse deltas of published weights (bf16 first; any dtype via its bit patterns).
The per-element passes are numba kernels (kernels.py); everything else is numpy, zstd, xxhash.
A payload is built from its coders' pieces and assembled once (parts.py)."""

from storage.delta.entropy import entropy_bound, entropy_bound_bits
from storage.delta.errors import CorruptPayload, DeltaBaseMismatch, DeltaError
from storage.delta.header import DeltaHeader
from storage.delta.apply import apply_delta
from storage.delta.payload import ENCODINGS, coded_as, encode_delta, read_header

__all__ = ["ENCODINGS", "CorruptPayload", "DeltaBaseMismatch", "DeltaError", "DeltaHeader",
           "apply_delta", "coded_as", "encode_delta", "entropy_bound", "entropy_bound_bits", "read_header"]
