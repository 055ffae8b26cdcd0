"""The trainer's side of weight sync: its publishers, kept in the trainer process across steps.

Unsharded (the default): one storage.weights.sparse_publisher.SparsePublisher per run; its bf16
copy of the last version is the next delta's base, and its thread serves full snapshots on
request. Sharded (`publish.shard_split`, or a megatron trainer group): a
storage.weights.sharded_publisher.ShardedPublisher per trainer rank for the trainer's layout (one Hugging
Face process: TP=1; a megatron group: its tp x pp x dp, each rank pushing its own slices; each
tensor-parallel slice split `shard_split` ways), one SparsePublisher per part, each serving its
part's snapshots; `publish_sharded` pushes every part of a one-process trainer and commits the
version. Shard rules come from the parameter names and the policy's config.
"""
from __future__ import annotations

import functools
from pathlib import Path
import threading
import time
from collections.abc import Iterable
from typing import Any

import torch

from core.config import RunConfig
from storage.relay.pool import shared_relay
from storage.shards.grain import PublishLayout
from storage.shards.layout import ParallelLayout
from storage.shards.plan import ParamSpec, param_specs
from storage.shards.rules import infer_rule
from storage.weights.coder_processes import shared_coders
from storage.weights.sharded_publisher import ShardedPublisher
from storage.weights.link_rate import LinkRate
from storage.weights.digest import tensors_digest
from storage.weights.sparse_publisher import SparsePublisher
from storage.weights.transfer_metrics import PublishReport

_publishers: dict[tuple[str, str], SparsePublisher] = {}
_sharded: dict[tuple[str, str], tuple[tuple, ShardedPublisher]] = {}  # -> (settings, publisher)
_lock = threading.Lock()
TRAINER_RANK = (0, 0, 0)  # the Hugging Face trainer: one process


def trainer_publisher(relay_kind: str, run: str, bucket_bytes: int, sparse: bool = True,
                      serve: bool = True, link_gbps: float | None = None,
                      stream: bool = True, measure_link: bool = False,
                      measure_cpu: bool = False, coder_processes: int = 0) -> SparsePublisher:
    """This process's publisher of `run` (kept across steps), its request server running;
    `link_gbps` makes it choose each tensor's form by time over that link (`measure_link`: by
    the rate its transfers measure once they have, storage/weights/link_rate.py;
    `measure_cpu`: with coding costed at this host's probed speed, storage/delta/host_speed.py);
    `stream`: coded deltas are announced for receivers to apply as they land;
    `coder_processes`: code deltas in that many processes (0: threads), see SparsePublisher."""
    with _lock:
        pub = _publishers.get((relay_kind, run))
        if pub is None:
            pub = SparsePublisher(shared_relay(relay_kind), run, bucket_bytes, sparse,
                                  link_rate=LinkRate() if measure_link else None)
            _publishers[relay_kind, run] = pub
        pub.bucket_bytes, pub.sparse, pub.link_gbps = bucket_bytes, sparse, link_gbps
        pub.stream, pub.measure_cpu = stream, measure_cpu
        if coder_processes != (0 if pub.coders is None else pub.coders.count) or \
                (pub.coders is not None and pub.coders.failed):  # failed: started again
            pub.coders = shared_coders(coder_processes) if coder_processes else None
        if measure_link != (pub.link_rate is not None):  # switched: kept while it stays on
            pub.link_rate = LinkRate() if measure_link else None
    if serve:
        pub.start_server()
    return pub


@functools.lru_cache(maxsize=8)
def _model_config(path: str):
    """The policy's HF config, read once per process (publish runs every step)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def trainer_layout(cfg: RunConfig) -> PublishLayout:
    """What the trainer publishes by: a megatron group's tp x pp x dp (each rank its own shard),
    else one process (TP=1); each tensor-parallel shard split publish.shard_split ways."""
    par = cfg.train.parallel if cfg.train.backend == "megatron" else None
    trainer = ParallelLayout(par.tp, par.pp, par.dp) if par else ParallelLayout(1)
    return PublishLayout(trainer, cfg.publish.shard_split or 1)


def policy_specs(cfg: RunConfig, weights: dict[str, torch.Tensor]) -> list[ParamSpec]:
    """Each weight's shard rule, from its HF name and the policy's config (heads, groups): a
    one-process trainer holds every weight whole, so its shapes are the full ones."""
    model_cfg = _model_config(str(cfg.models.policy_path()))
    return param_specs(weights.items(), {n: infer_rule(n, tuple(t.shape), None, model_cfg)
                                         for n, t in weights.items()})


def policy_full_specs(cfg: RunConfig) -> list[ParamSpec]:
    """Every published parameter's full shape and shard rule (from its HF name and the
    policy's config: heads, groups), read from the policy's checkpoint, since a trainer rank
    holds only slices; the same list on every rank and in every process."""
    return list(_policy_specs(str(cfg.models.policy_path())))


@functools.lru_cache(maxsize=8)
def _policy_specs(path: str) -> tuple[ParamSpec, ...]:
    """The checkpoint's shapes, read once per process (publish runs every step)."""
    from safetensors import safe_open

    model_cfg = _model_config(path)
    specs = []
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                if name == "lm_head.weight" and getattr(model_cfg, "tie_word_embeddings", False):
                    continue
                shape = tuple(st.get_slice(name).get_shape())
                specs.append(ParamSpec(name, shape, infer_rule(name, shape, None, model_cfg)))
    return tuple(sorted(specs, key=lambda p: p.name))


def sharded_publisher(cfg: RunConfig, specs: list[ParamSpec], serve: bool = True,
                      rank: tuple[int, int, int] = TRAINER_RANK) -> ShardedPublisher:
    """This process's sharded publisher of the run as trainer rank `rank` (kept across steps:
    its parts' bases), made anew, its bases dropped, when the layout, the parameters or the
    publish settings change."""
    p = cfg.publish
    layout = trainer_layout(cfg)
    settings = (layout, rank, tuple(specs), p.bucket_bytes, p.sparse, p.link_gbps, p.measure_link,
                p.measure_cpu)
    key = (cfg.stack.relay, cfg.run_id)
    with _lock:
        held, pub = _sharded.get(key, ((), None))
        if pub is None or held != settings:
            if pub is not None:
                pub.stop_servers()
            pub = ShardedPublisher(shared_relay(cfg.stack.relay), cfg.run_id, layout, rank,
                                   specs, p.bucket_bytes, p.sparse, p.link_gbps,
                                   link_rate=LinkRate() if p.measure_link else None,
                                   measure_cpu=p.measure_cpu)
            _sharded[key] = (settings, pub)
    if serve:
        pub.start_servers()
    return pub


def observe_pulls(cfg: RunConfig, records: Iterable[dict[str, Any]]) -> dict[str, float | None] | None:
    """Hand the engines' pull records (their get_bytes and get_s) to this process's publisher
    of the run, unsharded or sharded, for the link's get leg (storage/weights/link_rate.py);
    both legs as measured so far, None when it does not measure the link."""
    key = (cfg.stack.relay, cfg.run_id)
    with _lock:
        pub = _publishers.get(key) if not cfg.publishes_sharded else _sharded.get(key, ((), None))[1]
    if pub is None or pub.link_rate is None:
        return None
    for record in records:
        pub.observe_gets(record.get("get_bytes", 0), record.get("get_s", 0.0))
    return pub.link_rate.as_dict()


def publish_sharded(cfg: RunConfig, version: int, weights: dict[str, torch.Tensor]) -> PublishReport:
    """Push `version` by the trainer's declared layout and commit it; one report for all parts
    (its digest is the whole model's, what a TP=1 engine's weights hash to once pulled)."""
    t0 = time.perf_counter()
    specs = policy_specs(cfg, weights)
    pub = sharded_publisher(cfg, specs)
    parts = pub.publish(version, weights)
    pub.commit(version)
    return PublishReport.combine(version, [parts[k] for k in sorted(parts)], tensors_digest(weights),
                                 time.perf_counter() - t0)
