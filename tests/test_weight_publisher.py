"""Weight publishing through a relay: bit-exact pulls, key order, pruning, corruption."""
from __future__ import annotations

import json
from urllib.parse import unquote

import pytest
import torch

from storage.weights.buckets import CorruptBucket, Manifest
from storage.relay.base import RelayKeyMissing
from storage.relay.filesystem import FilesystemRelay
from storage.weights.payloads import register_decoder
from storage.weights.apply_pipeline import pull_weights
from storage.weights.publisher import publish_weights
from storage.weights.versions import bucket_key, latest_key, latest_version, manifest_key

from mooncake_fixtures import mooncake, mooncake_pair, mooncake_shared_pair, ns, relays  # noqa: F401 (fixtures)


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def model(seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed": (300, 64), "layers.0.q": (64, 64), "layers.0.norm": (64,),
              "layers.1.mlp": (256, 64), "lm_head.bias": (0,)}
    return {n: (torch.randn(s, generator=g) * scale).to(torch.bfloat16) for n, s in shapes.items()}


class RecordingRelay(FilesystemRelay):
    def __init__(self, root):
        super().__init__(root)
        self.puts: list[str] = []
        self.batches: list[list[str]] = []

    def put(self, key, data):
        self.puts.append(key)
        super().put(key, data)

    def get_many(self, keys):
        self.batches.append(list(keys))
        return super().get_many(keys)

    def remove_prefix(self, prefix):
        self.puts.append(f"remove {prefix}")
        return super().remove_prefix(prefix)


def test_publish_pull_bit_exact(relays, ns):
    writer, reader = relays
    run = ns.replace("/", "-")
    tensors = model()
    stats = publish_weights(writer, run, 3, tensors, bucket_bytes=16 << 10)
    assert stats.version == 3 and stats.tensors == 5
    # 16 KiB buckets: [embed 37.5 KiB] [q 8 KiB + norm] [mlp 32 KiB + the empty bias]
    assert stats.buckets == 3
    assert stats.bytes >= sum(t.numel() * 2 for t in tensors.values())
    version, got = pull_weights(reader, run)
    assert version == 3 and latest_version(reader, run) == 3
    assert list(got) == list(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == torch.bfloat16 and got[name].shape == t.shape
        assert bits(got[name]) == bits(t), name


def test_manifest_written_after_buckets_and_latest_last(tmp_path):
    relay = RecordingRelay(tmp_path)
    publish_weights(relay, "r", 1, model(), bucket_bytes=16 << 10)
    buckets = [i for i, k in enumerate(relay.puts) if "/bucket-" in k]
    order = {k: i for i, k in enumerate(relay.puts)}
    assert max(buckets) < order[manifest_key("r", 1)] < order[latest_key("r")]
    assert json.loads(relay.get(latest_key("r"))) == {"version": 1}


def test_pull_batches_respect_batch_bytes(tmp_path):
    relay = RecordingRelay(tmp_path)
    publish_weights(relay, "r", 0, model(), bucket_bytes=16 << 10)
    manifest = Manifest.from_json(relay.get(manifest_key("r", 0)))
    sizes = [b.nbytes for b in manifest.buckets]
    pull_weights(relay, "r", 0, batch_bytes=sizes[0] + sizes[1])
    expected, batch, total = [], [], 0  # greedy grouping computed independently
    for i, n in enumerate(sizes):
        if batch and total + n > sizes[0] + sizes[1]:
            expected.append(batch)
            batch, total = [], 0
        batch.append(bucket_key("r", 0, i))
        total += n
    expected.append(batch)
    assert relay.batches == expected and len(expected) < len(sizes)


def test_old_versions_pruned(relays, ns):
    writer, reader = relays
    run = ns.replace("/", "-")
    for v in range(5):
        publish_weights(writer, run, v, model(seed=v), bucket_bytes=16 << 10)
    for v in (0, 1):
        assert not reader.exists(manifest_key(run, v)) and not reader.exists(bucket_key(run, v, 0))
        with pytest.raises(RelayKeyMissing, match=f"v{v} of run"):
            pull_weights(reader, run, v)
    for v in (2, 3, 4):
        got_v, got = pull_weights(reader, run, v)
        assert got_v == v and bits(got["embed"]) == bits(model(seed=v)["embed"])
    assert pull_weights(reader, run)[0] == 4


def test_prunes_before_pushing_so_at_most_three_versions_are_held(tmp_path):
    relay = RecordingRelay(tmp_path)
    for v in range(4):
        publish_weights(relay, "r", v, model(seed=v), bucket_bytes=16 << 10)
    ops = relay.puts
    assert ops.index("remove rose/r/v0/") < ops.index(bucket_key("r", 3, 0))
    held = {k.split("/")[2] for k in (unquote(p.name) for p in tmp_path.iterdir())
            if k.endswith("/manifest")}
    assert held == {"v1", "v2", "v3"}


def test_republish_same_version_leaves_no_stale_bucket(tmp_path):
    relay = FilesystemRelay(tmp_path)
    publish_weights(relay, "r", 1, model(), bucket_bytes=16 << 10)
    assert relay.exists(bucket_key("r", 1, 2))
    small = {"w": torch.ones(4, dtype=torch.bfloat16)}
    publish_weights(relay, "r", 1, small, bucket_bytes=16 << 10)
    assert not relay.exists(bucket_key("r", 1, 1))
    assert list(pull_weights(relay, "r", 1)[1]) == ["w"]


def test_corrupted_bucket_rejected_whole(relays, ns):
    writer, reader = relays
    run = ns.replace("/", "-")
    publish_weights(writer, run, 0, model(), bucket_bytes=16 << 10)
    key = bucket_key(run, 0, 1)
    blob = bytearray(reader.get(key))
    blob[100] ^= 1
    writer.put(key, blob)
    with pytest.raises(CorruptBucket, match=rf"^{key}: entry 'layers.0.q' checksum mismatch"):
        pull_weights(reader, run, 0)
    writer.put(key, bytes(blob[:-64]))  # truncated
    with pytest.raises(CorruptBucket, match=rf"^{key}: \d+ bytes, expected"):
        pull_weights(reader, run, 0)


def test_missing_pieces_are_clear(tmp_path):
    relay = FilesystemRelay(tmp_path)
    with pytest.raises(RelayKeyMissing, match="no weights of run 'r'"):
        pull_weights(relay, "r")
    assert latest_version(relay, "r") is None
    publish_weights(relay, "r", 0, model(), bucket_bytes=16 << 10)
    relay.remove(bucket_key("r", 0, 1))
    with pytest.raises(RelayKeyMissing, match="v0 of run 'r' incomplete"):
        pull_weights(relay, "r", 0)
    with pytest.raises(ValueError, match="version"):
        publish_weights(relay, "r", -1, model())


def test_pluggable_encoding_gets_base(tmp_path):
    """A codec plugs in through `encoder` + register_decoder; the receiver's base reaches it."""
    relay = FilesystemRelay(tmp_path)
    base = model(seed=1)

    def xor_encoder(name, t):
        x = t.view(torch.int16) ^ base[name].view(torch.int16)
        return x.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"", {"encoding": "xor"}

    def xor_decoder(payload, meta, base_t, base_version):
        assert base_version == 7
        if payload.nbytes == 0:
            return base_t.clone()
        x = torch.frombuffer(payload, dtype=torch.int16).reshape(meta["shape"])
        return (x ^ base_t.view(torch.int16)).view(torch.bfloat16)

    register_decoder("xor", xor_decoder)
    new = model(seed=2)
    publish_weights(relay, "r", 8, new, bucket_bytes=16 << 10, encoder=xor_encoder)
    _, got = pull_weights(relay, "r", 8, base=base, base_version=7)
    assert all(bits(got[n]) == bits(new[n]) for n in new)
    with pytest.raises(CorruptBucket, match="unknown encoding 'xor'"):
        import storage.weights.payloads as wp
        del wp._DECODERS["xor"]
        pull_weights(relay, "r", 8, base=base, base_version=7)
