"""The relay work of a publish before its first bucket (pruning, the versions list, clearing the
version's prefix) runs on the pusher's thread; a failed push is listed and pruned in turn; the
run's only publisher does not read back the versions list it wrote."""
from __future__ import annotations

import json
import re
from urllib.parse import unquote

import pytest
import torch

from storage.relay.filesystem import FilesystemRelay
from storage.weights.publisher import publish_weights
from storage.weights.versions import bucket_key, manifest_key
from storage.weights.sparse_publisher import SparsePublisher


def model(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.w": torch.randn(64, 64, generator=g).to(torch.bfloat16)
            for i in range(4)}


class CountingRelay(FilesystemRelay):
    """The project's filesystem relay, logging each operation in order."""

    def __init__(self, root):
        super().__init__(root)
        self.ops: list[str] = []

    def put(self, key, data):
        self.ops.append(f"put {key}")
        super().put(key, data)

    def get(self, key):
        self.ops.append(f"get {key}")
        return super().get(key)

    def remove_prefix(self, prefix):
        self.ops.append(f"remove {prefix}")
        return super().remove_prefix(prefix)


def stored_versions(root) -> set[str]:
    """The versions of run "r" that have any object in the relay (its files, by key)."""
    keys = (unquote(p.name) for p in root.iterdir())
    return {m[1] for k in keys if (m := re.match(r"rose/r/(v\d+)/", k))}


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_failed_push_is_listed_and_pruned_in_turn(tmp_path, pipelined):
    class LosesManifest(FilesystemRelay):  # the trainer dies before v1's manifest goes in
        def put(self, key, data):
            if key == manifest_key("r", 1):
                raise ConnectionError("trainer died mid-push")
            super().put(key, data)

    relay = LosesManifest(tmp_path)
    publish_weights(relay, "r", 0, model(0), bucket_bytes=8 << 10, pipelined=pipelined)
    with pytest.raises(ConnectionError, match="mid-push"):
        publish_weights(relay, "r", 1, model(1), bucket_bytes=8 << 10, pipelined=pipelined)
    assert relay.exists(bucket_key("r", 1, 0)) and not relay.exists(manifest_key("r", 1))
    assert json.loads(relay.get("rose/r/versions")) == [0, 1]
    for v in (2, 3, 4):
        publish_weights(relay, "r", v, model(v), bucket_bytes=8 << 10, pipelined=pipelined)
    # v1's leftover buckets went with the versions older than v4 - 2, as a complete one's would
    assert stored_versions(tmp_path) == {"v2", "v3", "v4"}


def test_an_error_before_the_first_bucket_fails_the_publish_and_writes_nothing(tmp_path):
    class NoRemove(FilesystemRelay):
        def remove_prefix(self, prefix):
            raise ConnectionError(f"relay gone while clearing {prefix}")

    relay = NoRemove(tmp_path)
    with pytest.raises(ConnectionError, match="relay gone while clearing rose/r/v0/"):
        publish_weights(relay, "r", 0, model(0), bucket_bytes=8 << 10)
    assert not relay.exists(bucket_key("r", 0, 0)) and not relay.exists(manifest_key("r", 0))
    assert not relay.exists("rose/r/latest")


def test_the_versions_list_goes_before_the_first_bucket_and_the_manifest_last(tmp_path):
    relay = CountingRelay(tmp_path)
    publish_weights(relay, "r", 0, model(0), bucket_bytes=8 << 10)
    ops = relay.ops
    first_bucket = ops.index(f"put {bucket_key('r', 0, 0)}")
    assert ops.index("put rose/r/versions") < first_bucket
    assert ops.index("remove rose/r/v0/") < first_bucket
    assert ops[-2:] == [f"put {manifest_key('r', 0)}", "put rose/r/latest"]


def test_the_runs_only_publisher_does_not_read_back_its_versions_list(tmp_path):
    relay = CountingRelay(tmp_path)
    pub = SparsePublisher(relay, "r", bucket_bytes=8 << 10, link_gbps=10)
    for v in range(6):
        pub.publish(v, model(v))
    # one read, at its first publish (a restarted trainer learns what an earlier one left)
    assert relay.ops.count("get rose/r/versions") == 1
    assert stored_versions(tmp_path) == {"v3", "v4", "v5"}
    assert json.loads(FilesystemRelay.get(relay, "rose/r/versions")) == [3, 4, 5]  # uncounted
    # a fresh publisher (a restart) reads the list and prunes what the last one left
    again = SparsePublisher(relay, "r", bucket_bytes=8 << 10, link_gbps=10)
    again.publish(8, model(8))
    assert relay.ops.count("get rose/r/versions") == 2
    assert stored_versions(tmp_path) == {"v8"}
