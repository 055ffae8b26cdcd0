"""The weights digest: one definition on every side, with per-tensor hashes reused."""
import torch

from storage.delta import encode_delta, read_header
from storage.weights.digest import tensor_hash, tensors_digest


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"b.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
            "a.bias": torch.randn(32, generator=g).to(torch.bfloat16),
            "empty": torch.zeros(0, dtype=torch.bfloat16)}


def test_digest_is_bit_exact_and_order_independent():
    w = _weights()
    assert tensors_digest(w) == tensors_digest(dict(reversed(list(w.items()))), workers=2)
    flipped = {**w, "a.bias": w["a.bias"].clone()}
    flipped["a.bias"].view(torch.int16)[3] ^= 1
    assert tensors_digest(flipped) != tensors_digest(w)
    renamed = {("c.bias" if n == "a.bias" else n): t for n, t in w.items()}
    assert tensors_digest(renamed) != tensors_digest(w)


def test_a_delta_result_checksum_is_the_tensor_hash_and_is_reused():
    w = _weights()
    new = w["b.weight"].clone()
    new.view(torch.int16)[0, :5] += 1
    payload = encode_delta(new, w["b.weight"], name="b.weight", base_version=0, target_version=1)
    assert read_header(payload).result_checksum == tensor_hash(new)
    after = {**w, "b.weight": new}
    known = {"b.weight": read_header(payload).result_checksum}
    assert tensors_digest(after, known) == tensors_digest(after)
    # what is known is trusted, not re-read: a wrong value shows in the digest
    assert tensors_digest(after, {"b.weight": 0}) != tensors_digest(after)


def test_a_raw_entrys_checksum_is_its_tensors_hash():
    """The publisher and the receiver take raw tensors' hashes from the bucket entries; that is
    only right if packing a raw tensor hashes exactly its bits."""
    from storage.weights.buckets import pack
    from storage.weights.digest import raw_entry_hashes, tensor_hash
    from storage.weights.payloads import raw_encoder

    g = torch.Generator().manual_seed(3)
    tensors = {"a": torch.randn(33, 7, generator=g).to(torch.bfloat16),
               "b": torch.randn(5, generator=g),
               "c": torch.arange(6, dtype=torch.int64).reshape(2, 3).t(),  # not contiguous
               "d": torch.zeros(0, dtype=torch.bfloat16)}
    items = [(n, *raw_encoder(n, t)) for n, t in tensors.items()]
    manifest, _ = pack(items, bucket_bytes=256)
    assert raw_entry_hashes(manifest.buckets) == {n: tensor_hash(t) for n, t in tensors.items()}
