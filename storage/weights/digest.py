"""The digest of a set of weights: equal digests = bit-identical weights, whoever computed it.

xxh3-64 over the names in sorted order, each followed by its tensor's content hash (8 bytes,
little-endian): xxh3-64 of its bits, taken over 8 MB blocks for a tensor of 32 MB or more
(storage/delta/content_hash.py). Per tensor, that hash is exactly the result checksum a delta
payload carries (storage/delta/header.py), so a publisher that just encoded a tensor, or a
receiver that just verified a decoded one, passes it in `known` and the tensor is not read a
second time. A payload sent raw is the tensor's bits as they are, so its bucket entry's
checksum (the same content hash, storage/weights/buckets.py) is that hash too (`raw_entry_hashes`): the
publisher has it from packing, the receiver from the bucket it verified. The whole-model
pass the digest used to cost on each side is gone; what is left is hashed on every core.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import xxhash

from storage.delta.content_hash import content_hash
from storage.weights.buckets import BucketInfo
from storage.cores import available_cores
from storage.weights.parallel import ordered_map


def tensor_hash(tensor: torch.Tensor) -> int:
    """The content hash of a tensor's bits (storage/delta/content_hash.py: xxh3-64, over blocks
    for a large tensor), what storage.delta's result checksum is for its payload."""
    t = tensor.detach().to("cpu").contiguous().reshape(-1)
    return content_hash(t.view(torch.uint8).numpy() if t.numel() else b"")


def raw_entry_hashes(infos: Iterable[BucketInfo]) -> dict[str, int]:
    """name -> tensor_hash of every payload sent raw, from the buckets' entry checksums."""
    return {e.name: int(e.checksum, 16) for b in infos for e in b.entries
            if e.meta.get("encoding") == "raw" and "span" not in e.meta}  # (spans: spans.py)


def tensors_digest(tensors: Mapping[str, torch.Tensor], known: Mapping[str, int] | None = None,
                   workers: int | None = None) -> str:
    """Order-independent digest of names and exact bit patterns. `known`: tensor hashes
    already computed (tensor_hash values, e.g. verified result checksums), reused as they are."""
    names = sorted(tensors)
    known = known or {}
    todo = [n for n in names if n not in known]
    hashed = dict(zip(todo, ordered_map(lambda n: tensor_hash(tensors[n]), todo,
                                        available_cores() if workers is None else workers,
                                        lambda n: tensors[n].numel() * tensors[n].element_size())))
    h = xxhash.xxh3_64()
    for name in names:
        h.update(name.encode())
        h.update((known[name] if name in known else hashed[name]).to_bytes(8, "little"))
    return h.hexdigest()
