"""Sharded publish in the weights path: a TP=2 megatron trainer (gloo, two processes) to a TP=1
receiver, a TP=1 trainer to two TP=2 receiver ranks pulling half the bytes each, deltas
bit-exact, and a version visible only once every rank's parts are in."""
from __future__ import annotations


import pytest
import torch

from storage.relay.filesystem import FilesystemRelay
from storage.shards.grain import PublishLayout, param_objects, rank_parts
from storage.shards.layout import ParallelLayout
from storage.shards.plan import ParamSpec, assemble, param_specs, split_full
from storage.shards.rules import ShardRule, infer_model_rules, infer_rule, megatron_attrs
from storage.weights.versions import latest_version
from storage.weights.sharded_publisher import ShardedPublisher
from storage.weights.sharded_versions import commit_sharded
from storage.weights.sharded_receiver import NeedsFullSnapshot, ShardedReceiver

from mooncake_fixtures import mooncake, mooncake_pair, mooncake_shared_pair, ns, relays  # noqa: F401 (fixtures)

DIMS = dict(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)


def _tiny(dims: dict = DIMS) -> tuple[object, dict[str, torch.Tensor]]:
    """The project's tiny policy shape (Qwen3, tied embeddings), bf16, the same in every process."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen3Config(**dims)
    model = Qwen3ForCausalLM(cfg)
    return model, {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}


def _step(t: torch.Tensor) -> torch.Tensor:
    """The next version: one ulp up on a value-determined ~1/7 of the elements (elementwise, so
    a shard of the result is the result of the shard: ranks need not talk to agree on it)."""
    bits = t.view(torch.int16)
    return torch.where(bits % 7 == 0, bits + 1, bits).view(torch.bfloat16)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[n].shape == b[n].shape and torch.equal(a[n].view(torch.int16), b[n].view(torch.int16)) for n in a)


# -- (a) TP=2 megatron trainer, two processes on gloo -> TP=1 receiver ---------------------------

def _megatron_rank(rank: int, rendezvous: str, root: str, dims: dict = DIMS) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    try:
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
        from megatron.core.transformer.transformer_config import TransformerConfig

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
        hf, full = _tiny(dims)
        cfg = TransformerConfig(num_layers=dims["num_hidden_layers"], hidden_size=dims["hidden_size"],
                                num_attention_heads=dims["num_attention_heads"],
                                num_query_groups=dims["num_key_value_heads"], kv_channels=dims["head_dim"],
                                ffn_hidden_size=dims["intermediate_size"], tensor_model_parallel_size=2,
                                use_cpu_initialization=True, params_dtype=torch.float32)
        rules, local = {}, {}
        for name, w in full.items():
            mod = name.rsplit(".", 2)[-2]
            init = lambda m, w=w: m.copy_(w.float())  # noqa: E731 (bf16 values: exact in fp32)
            if mod == "embed_tokens":
                layer = VocabParallelEmbedding(w.shape[0], w.shape[1], config=cfg, init_method=init)
            elif mod in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
                layer = ColumnParallelLinear(w.shape[1], w.shape[0], config=cfg, bias=False,
                                             gather_output=False, init_method=init)
            elif mod in ("o_proj", "down_proj"):
                layer = RowParallelLinear(w.shape[1], w.shape[0], config=cfg, bias=False, input_is_parallel=True,
                                          skip_bias_add=False, init_method=init)
            else:  # norms: not tensor-parallel, every rank holds all of it
                rules[name], local[name] = infer_rule(name, w.shape, None, hf.config), w
                continue
            p = layer.weight
            rules[name] = infer_rule(name, tuple(w.shape), type(layer).__name__, hf.config, megatron_attrs(p))
            local[name] = p.detach().to(torch.bfloat16)
            # megatron holds exactly the slice the rule says (else the publish would be wrong)
            assert torch.equal(local[name], split_full(w, rules[name], 2)[rank]), name
        specs = param_specs(full.items(), rules)
        layout = PublishLayout(ParallelLayout(2))
        relay = FilesystemRelay(root)
        pub = ShardedPublisher(relay, "tp2", layout, (rank, 0, 0), specs, bucket_bytes=16 << 10)
        for version in (0, 1):
            reports = pub.publish(version, local)
            assert {r.kind for r in reports.values()} == {"full" if version == 0 else "delta"}
            dist.barrier()  # every rank's parts pushed
            if rank == 0:
                commit_sharded(relay, "tp2", version, layout, specs, timeout_s=30)
            dist.barrier()
            local = {n: _step(t) for n, t in local.items()}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_megatron_tp2_trainer_to_tp1_receiver_bit_exact(tmp_path) -> None:
    pytest.importorskip("megatron.core.tensor_parallel", reason="megatron-core not importable (GPU extra)",
                        exc_type=ImportError)
    from megatron_ranks import launch

    launch(_megatron_rank, (f"file://{tmp_path}/rendezvous", str(tmp_path / "relay")), nprocs=2)
    _, full = _tiny()
    receiver = ShardedReceiver(FilesystemRelay(tmp_path / "relay"), "tp2", ParallelLayout(1))
    first = receiver.pull(0)
    assert first.mode == "full" and _same(receiver.tensors, full)  # the unsharded model, bit for bit
    assert first.bytes == first.published_bytes  # TP=1 needs every byte both ranks pushed
    assert {p.split("/")[1] for p in first.parts} == {"r0.0.0", "r1.0.0"}
    second = receiver.pull()
    assert second.version == 1 and second.mode == "delta"
    assert _same(receiver.tensors, {n: _step(t) for n, t in full.items()})
    assert second.bytes < first.bytes  # the delta is smaller than the snapshot


# -- (b) TP=1 trainer -> two TP=2 receiver ranks, each pulling its half ---------------------------

def _two_ranks(writer, reader, run: str, split: int) -> tuple[list[ShardedReceiver], list, dict, ShardedPublisher]:
    model, full = _tiny()
    specs = param_specs(full.items(), infer_model_rules(model, model.config))
    layout = PublishLayout(ParallelLayout(1), split=split)
    pub = ShardedPublisher(writer, run, layout, (0, 0, 0), specs, bucket_bytes=16 << 10)
    pub.publish(0, full)
    commit_sharded(writer, run, 0, layout, specs)
    ranks = [ShardedReceiver(reader, run, ParallelLayout(2), (t, 0, 0)) for t in range(2)]
    return ranks, specs, full, pub


def _assembled(ranks: list[ShardedReceiver], specs: list[ParamSpec]) -> dict[str, torch.Tensor]:
    return {p.name: assemble([r.tensors[p.name] for r in ranks], p.rule, p.shape) for p in specs}


def test_tp1_trainer_to_two_tp2_ranks_each_pulls_half(relays, ns) -> None:
    writer, reader = relays
    run = ns.replace("/", "-")
    ranks, specs, full, pub = _two_ranks(writer, reader, run, split=2)
    reports = [r.pull() for r in ranks]
    for t, (r, rep) in enumerate(zip(ranks, reports)):
        assert rep.mode == "full" and rep.parts == ["shards/r0.0.0/all", f"shards/r0.0.0/g{t}"]
        # its own slices exactly, and about half the published bytes (replicated norms: whole)
        assert _same(r.tensors, {p.name: split_full(full[p.name], p.rule, 2)[t] for p in specs})
        assert 0.45 < rep.bytes / rep.published_bytes < 0.55, rep
    assert reports[0].bytes + reports[1].bytes < 1.06 * reports[0].published_bytes
    assert _same(_assembled(ranks, specs), full)
    # the next version as deltas: each rank still pulls only its half, bit-exact
    model_v1 = {n: _step(t) for n, t in full.items()}
    pub.publish(1, model_v1)
    commit_sharded(writer, run, 1, pub.layout, specs)
    deltas = [r.pull() for r in ranks]
    assert [d.mode for d in deltas] == ["delta", "delta"] and [d.version for d in deltas] == [1, 1]
    assert all(0.4 < d.bytes / d.published_bytes < 0.6 for d in deltas), deltas
    assert _same(_assembled(ranks, specs), model_v1)
    # a receiver that holds nothing cannot take a delta; nothing is installed
    late = ShardedReceiver(reader, run, ParallelLayout(2), (1, 0, 0))
    with pytest.raises(NeedsFullSnapshot, match="delta onto v0"):
        late.pull()
    assert late.tensors is None and late.version is None


def test_unsplit_tp1_publish_sends_each_tp2_rank_everything(tmp_path) -> None:
    relay = FilesystemRelay(tmp_path)
    ranks, _, _, _ = _two_ranks(relay, relay, "unsplit", split=1)
    rep = ranks[0].pull()
    assert rep.bytes == rep.published_bytes  # whole tensors in one part: why `split` exists


def test_version_invisible_until_every_rank_commits(tmp_path) -> None:
    relay = FilesystemRelay(tmp_path)
    model, full = _tiny()
    specs = param_specs(full.items(), infer_model_rules(model, model.config))
    layout = PublishLayout(ParallelLayout(2))
    shards = {t: {p.name: split_full(full[p.name], p.rule, 2)[t] for p in specs} for t in range(2)}
    pubs = [ShardedPublisher(relay, "r", layout, (t, 0, 0), specs) for t in range(2)]
    for t in range(2):
        pubs[t].publish(0, shards[t])
    commit_sharded(relay, "r", 0, layout, specs)
    receiver = ShardedReceiver(relay, "r")
    receiver.pull()
    pubs[0].publish(1, {n: _step(x) for n, x in shards[0].items()})  # rank 1 never pushes v1
    with pytest.raises(TimeoutError, match="r1.0.0"):
        commit_sharded(relay, "r", 1, layout, specs, timeout_s=0.2)
    assert latest_version(relay, "r") == 0 and receiver.pull().mode == "noop"
    # a part pushed again after its version was committed is refused, the held version kept
    pubs[1].publish(0, {n: _step(x) for n, x in shards[1].items()})
    with pytest.raises(RuntimeError, match="pushed again after"):
        ShardedReceiver(relay, "r").pull(0)
    assert receiver.version == 0 and _same(receiver.tensors, full)


def test_objects_groups_and_fallback_hand_computed() -> None:
    col = ParamSpec("model.layers.0.mlp.up_proj.weight", (8, 4), ShardRule("column", 0))
    objs = param_objects(col, PublishLayout(ParallelLayout(1), split=2))
    assert [(o.key, o.group, h) for o, h in objs] == [
        ("model.layers.0.mlp.up_proj.weight/d0:0-4", "g0", [0]),
        ("model.layers.0.mlp.up_proj.weight/d0:4-8", "g1", [0])]
    # 10 vocab rows: grain 4 (3 rows each) does not nest in TP 2 (5 rows each): the trainer's own
    vocab = ParamSpec("model.embed_tokens.weight", (10, 4), ShardRule("vocab", 0))
    objs = param_objects(vocab, PublishLayout(ParallelLayout(2), split=2))
    assert [(o.slice.ranges, o.group, h) for o, h in objs] == [(((0, 5),), "g0-1", [0]), (((5, 10),), "g2-3", [1])]
    # a replicated tensor is one object, pushed by one rank only, in the group every rank needs
    norm = ParamSpec("model.norm.weight", (4,), ShardRule("replicated"))
    plan = rank_parts([col, norm], PublishLayout(ParallelLayout(2, 1, 2)))
    pushed = [o.key for parts in plan.values() for objs in parts.values() for o in objs]
    assert sorted(pushed) == sorted(set(pushed)) and "model.norm.weight/full" in pushed
    assert [part for parts in plan.values() for part in parts if part.endswith("/all")] != []
    with pytest.raises(ValueError, match="split must be a positive int"):
        PublishLayout(ParallelLayout(1), split=0)
