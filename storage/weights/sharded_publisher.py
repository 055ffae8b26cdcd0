"""Sharded publishing: each trainer rank pushes its own shards, one commit makes the version.

The keys of a sharded version and its commit: storage/weights/sharded_versions.py.
Each part is pushed by a storage.weights.sparse_publisher.SparsePublisher of its own (the same
delta coding, time model and bf16 base copy as the unsharded path, under the part's prefix),
which also answers a receiver's request for a full snapshot of the part (`start_servers`);
given a `link_rate` (storage/weights/link_rate.LinkRate) they all measure and choose by that
one (each part's puts, and the receivers' gets handed to `observe_gets`).
A publisher holding every part (a trainer of one rank, the live path) also puts its committed
version back, every part in full, if the relay loses it (a master restart), as the unsharded
trainer publisher does.
"""
from __future__ import annotations

import logging
import threading

import torch

from storage.relay.base import Relay, RelayError
from storage.shards.grain import PublishLayout, cut, rank_parts
from storage.shards.layout import Rank, slice_for
from storage.shards.plan import ParamSpec
from storage.weights.buckets import DEFAULT_BUCKET_BYTES, Manifest
from storage.weights.link_rate import LinkRate
from storage.weights.sharded_versions import commit_sharded, expected_parts
from storage.weights.sparse_publisher import SparsePublisher
from storage.weights.transfer_metrics import PublishReport
from storage.weights.versions import manifest_key

log = logging.getLogger(__name__)


class ShardedPublisher:
    """Publishes one trainer rank's shards of `run`; see the module docstring."""

    def __init__(self, relay: Relay, run: str, layout: PublishLayout, rank: Rank,
                 params: list[ParamSpec], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 sparse: bool = True, link_gbps: float | None = None,
                 workers: int | None = None, link_rate: LinkRate | None = None,
                 measure_cpu: bool = False) -> None:
        if rank not in layout.trainer.ranks():
            raise ValueError(f"rank {rank} is not a rank of trainer layout {layout.trainer}")
        self.relay, self.run, self.layout, self.rank = relay, run, layout, rank
        self.params = {p.name: p for p in params}
        self.parts = rank_parts(params, layout)[rank]
        self.link_rate = link_rate  # one link, whichever part measured it
        self._pubs = {part: SparsePublisher(relay, run, bucket_bytes, sparse, link_gbps, workers, part,
                                            link_rate=link_rate, measure_cpu=measure_cpu)
                      for part in self.parts}
        # a rank publishing every part (a trainer of one rank) can also commit a version again
        self.whole = sorted(self.parts) == expected_parts(params, layout)
        self.committed: int | None = None  # the last version this publisher committed
        self._lock = threading.Lock()  # publish, commit and republish_if_lost, one at a time
        self._watch: threading.Event | None = None

    def objects(self, local: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
        """part -> {object name: tensor}, cut from this rank's local shards (param name ->
        the tensor this rank holds, as its layout slices it)."""
        t = self.rank[0]
        out: dict[str, dict[str, torch.Tensor]] = {}
        for part, objs in self.parts.items():
            out[part] = {}
            for obj in objs:
                p = self.params[obj.name]
                held = slice_for(p.rule, p.shape, t, self.layout.trainer.tp)
                shard = local.get(obj.name)
                if shard is None:
                    raise KeyError(f"rank {self.rank} must publish {obj.key} but holds no {obj.name!r}")
                if tuple(shard.shape) != held.local_shape(p.shape):
                    raise ValueError(f"{obj.name}: rank {self.rank} holds {tuple(shard.shape)}, its "
                                     f"layout says {held.local_shape(p.shape)}")
                out[part][obj.key] = cut(shard.detach().to("cpu", torch.bfloat16), held, obj.slice, p.shape)
        return out

    def observe_gets(self, nbytes: int, seconds: float) -> bool:
        """A receiver's gets (its ShardPullReport's get_bytes and get_s): SparsePublisher's."""
        return self.link_rate is not None and self.link_rate.observe("get", nbytes, seconds)

    def start_servers(self, interval_s: float = 0.1, lost_every_s: float = 1.0) -> None:
        """Answer receivers' requests for a full snapshot of a part (one thread per part); a
        whole publisher also looks for a lost committed version every `lost_every_s`."""
        for pub in self._pubs.values():
            pub.start_server(interval_s)
        if self.whole and self._watch is None:
            self._watch = stop = threading.Event()

            def watch() -> None:
                while not stop.wait(lost_every_s):
                    try:
                        self.republish_if_lost()
                    except (RelayError, OSError, TimeoutError) as e:  # relay still down: retry
                        log.warning("lost-version watch of run %s: %s", self.run, e)

            threading.Thread(target=watch, name=f"rose-lost-{self.run}", daemon=True).start()

    def stop_servers(self) -> None:
        for pub in self._pubs.values():
            pub.stop_server()
        if self._watch is not None:
            self._watch.set()
            self._watch = None

    def publish(self, version: int, local: dict[str, torch.Tensor]) -> dict[str, PublishReport]:
        """Push this rank's parts of `version` (not visible until committed); per part its
        report: a delta against this rank's previous push of it when possible, else full."""
        with self._lock:
            return {part: self._pubs[part].publish(version, tensors)
                    for part, tensors in self.objects(local).items()}

    def commit(self, version: int, timeout_s: float = 120.0) -> Manifest:
        """commit_sharded of `version` (waits for the other ranks' parts), remembered as the
        version a whole publisher puts back if the relay loses it."""
        with self._lock:
            manifest = commit_sharded(self.relay, self.run, version, self.layout,
                                      list(self.params.values()), timeout_s)
            self.committed = version
            return manifest

    def republish_if_lost(self) -> bool:
        """If the relay lost the committed version (a master restart), push every part again in
        full and commit it; True if it did. Only a whole publisher can: other ranks' parts are
        not here to commit with (their trainer's next publish makes a version again)."""
        with self._lock:
            v = self.committed
            if not self.whole or v is None or self.relay.exists(manifest_key(self.run, v)):
                return False
            if any(self._pubs[part].snapshots.republish_held(v) is None for part in sorted(self._pubs)):
                return False  # a part holds another version: not this publisher's to mend
            commit_sharded(self.relay, self.run, v, self.layout, list(self.params.values()))
            return True
