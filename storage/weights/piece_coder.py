"""How one piece of a delta (a tensor, or one block of a large one) is coded: raw or a storage.delta
payload, by time (storage/delta/time_model.py) when a link is given, else by bytes.

A plain function of the piece, its base and the link, so the publisher's threads and its coder
processes (storage/weights/coder_processes.py) run the very same code, and a piece comes out
byte for byte the same wherever it was coded.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from storage.delta import coded_as, encode_delta, read_header, time_model
from storage.delta.bits import DTYPE_CODES
from storage.relay.base import Buffer
from storage.weights.tensor_form import raw_first
from storage.weights.transfer_metrics import changed_in_payload


@dataclass
class CodedPiece:
    """A piece as it goes out: `payload` None means its bytes as they are (raw_encoder);
    `checksum`: its content hash when it was coded (kept for the digest even if it then went
    raw); `changed`: the change count the payload states, when it does; `seconds`: how long
    `code_piece` took (in whichever process coded it)."""

    payload: Buffer | None
    encoding: str
    checksum: int | None = None
    changed: int | None = None
    seconds: float = 0.0


def code_piece(name: str, tensor: torch.Tensor, old: torch.Tensor | None,
               link: time_model.Link | None, base_version: int | None,
               target_version: int) -> CodedPiece:
    """`tensor` against `old` (None: a full snapshot's dense payload). Raw when its dtype is
    not the codec's, or when the time model says raw reaches the receiver sooner: judged
    before the change scan (tensor_form.raw_first), and again once the payload's size is
    known (time_model.raw_after_encode)."""
    t0 = time.perf_counter()
    piece = _coded(name, tensor, old, link, base_version, target_version)
    piece.seconds = time.perf_counter() - t0
    return piece


def _coded(name: str, tensor: torch.Tensor, old: torch.Tensor | None,
           link: time_model.Link | None, base_version: int | None,
           target_version: int) -> CodedPiece:
    codable = tensor.dtype in DTYPE_CODES
    raw, density = raw_first(tensor, old, link) if codable and link and old is not None \
        else (not codable, None)
    if raw:
        return CodedPiece(None, "raw")
    data = encode_delta(tensor, old, name=name, base_version=base_version,
                        target_version=target_version, density=density)
    header = read_header(data)
    encoding = coded_as(data, header)
    changed = changed_in_payload(data, header) if old is not None else None
    if link and old is not None and time_model.raw_after_encode(
            encoding, tensor.numel() * tensor.element_size(), memoryview(data).nbytes,
            tensor.element_size(), link):
        return CodedPiece(None, "raw", header.result_checksum, changed)
    return CodedPiece(data, encoding, header.result_checksum, changed)
