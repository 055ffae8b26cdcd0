"""Choosing each tensor's form by predicted time (storage/delta/time_model.py) and coding it on
every core (storage/weights/parallel.py): raw on fast links and tiny tensors, coded on slow
links, bit-exact either way, with one thread or several."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from core.config import PublishConfig
from storage.delta import time_model as tm
from storage.relay.filesystem import FilesystemRelay
from storage.weights.parallel import ordered_map
from storage.weights.apply_pipeline import pull_weights
from storage.weights.versions import read_manifest
from storage.weights.receiver import WeightReceiver
from storage.weights.sparse_publisher import SparsePublisher


def versions(seed: int = 0, moved: float = 0.02) -> tuple[dict, dict]:
    """A base and a next version where a fraction `moved` (~2%) of each tensor's bf16
    elements move."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (2048, 256), "model.layers.0.mlp.up_proj.weight":
              (512, 256), "model.norm.weight": (256,), "model.tiny": (3,)}
    old = {n: (0.02 * torch.randn(s, generator=g)).to(torch.bfloat16) for n, s in shapes.items()}
    new = {}
    for n, t in old.items():
        hit = torch.rand(t.shape, generator=g) < moved
        new[n] = torch.where(hit, (t.float() * 1.01 + 1e-3).to(torch.bfloat16), t)
    return old, new


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def entry_encodings(relay, run: str, version: int) -> dict[str, str]:
    from storage.delta import read_header

    manifest, out = read_manifest(relay, run, version), {}
    blobs = relay.get_many([f"rose/{run}/v{version}/bucket-{b.index}" for b in manifest.buckets])
    for b, e in manifest.entries():
        if e.meta["encoding"] == "raw":
            out[e.name] = "raw"
        else:
            out[e.name] = read_header(memoryview(blobs[b.index])[e.offset:e.offset + e.length]
                                      ).encoding
    return out


def test_model_flips_between_raw_and_coded():
    big = 64 << 20
    # fast link, a third moved: ternary's coding costs more than the raw bytes' trip
    assert tm.raw_before_scan(big, 2, 0.3, tm.Link(100, 2))
    assert not tm.raw_before_scan(big, 2, 0.3, tm.Link(1, 2))
    assert not tm.raw_before_scan(big, 2, 0.02, tm.Link(1, 2))  # slow link: code it
    assert tm.raw_before_scan(2 * 896, 2, 0.02, tm.Link(1, 2))  # tiny: fixed costs dominate
    assert tm.raw_before_scan(big, 2, 1.0, tm.Link(10, 2))      # everything moved: ternary's
    assert not tm.raw_before_scan(big, 2, 1.0, tm.Link(1, 2))   # cost wins only on slow links
    assert tm.coded_estimate(0.02, big, 2)[0] == "ef"
    assert tm.coded_estimate(0.3, big, 2)[0] == "ternary"
    assert tm.coded_estimate(0.99, big, 2)[0] == "ternary_dense"
    # a ternary body of ~5.5 bits per element (nearly all moved) applies at ternary_dense speed
    assert tm.raw_after_encode("ternary", big, big * 11 // 32, 2, tm.Link(10, 2))
    assert not tm.raw_after_encode("ternary", big, big // 10, 2, tm.Link(10, 2))
    assert tm.coded_estimate(0.0, big, 2)[1] == 0 < tm.coded_estimate(0.02, big, 2)[1] < big / 10
    # once coded, Elias-Fano stays: applying it in place costs less than raw bytes' trip
    # through fresh memory, even where the wire is free
    assert not tm.raw_after_encode("ef", big, big // 40, 2, tm.Link(1000, 2))
    assert not tm.raw_after_encode("ef", big, big // 40, 2, tm.Link(1, 2))
    assert tm.tensor_s("raw", big, big, tm.Link(1000, 2)) > \
        sum(tm.stages_s(tm.COSTS["ef"], big, big // 40, tm.Link(1000, 2))[::2])
    # more cores make coding cheaper, never dearer
    assert tm.tensor_s("ef", big, big // 40, tm.Link(10, 8)) < tm.tensor_s("ef", big, big // 40,
                                                                           tm.Link(10, 1))
    assert tm.pipelined_s(125_000_000, 0.5, 4.0, tm.Link(1, 2)) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        tm.Link(0)
    with pytest.raises(ValueError):
        tm.Link(1, cores=0)


def test_a_sample_that_costs_more_than_coding_could_save_is_not_taken(monkeypatch):
    """Mid-sized tensors on a fast link go raw unsampled (the most coding could save is less
    than the density sample costs); a large one on a slow link is still sampled."""
    from storage.delta import bits as delta_bits
    from storage.weights.tensor_form import raw_first

    mid = 96 << 10  # the demo policy's MLP matrices
    # a link where an empty coding would beat raw, but by less than the sample costs
    link = next(tm.Link(g, 2) for g in range(1, 200) if not tm.raw_before_scan(
        mid, 2, 0.0, tm.Link(g, 2)) and not tm.worth_sampling(mid, mid, tm.Link(g, 2)))
    assert tm.worth_sampling(64 << 20, 256 << 10, link)
    sampled = []
    real = delta_bits.estimated_density
    monkeypatch.setattr(delta_bits, "estimated_density",
                        lambda a, b: sampled.append(a.size) or real(a, b))
    t = torch.zeros(mid // 2, dtype=torch.bfloat16)
    assert raw_first(t, t.clone(), link) == (True, None) and sampled == []
    big = torch.zeros(8 << 20, dtype=torch.bfloat16)
    assert raw_first(big, big.clone(), link) == (False, 0.0)  # nothing moved: code it
    assert sampled == [big.numel()]


_N = 48 << 10  # elements: the demo policy's MLP matrices


def _moved_everywhere(monkeypatch) -> tuple[dict, dict, list]:
    """(base, a version whose every element moved, the sizes of the density samples taken)."""
    from storage.delta import bits as delta_bits

    old = {f"w{i}": torch.zeros(_N, dtype=torch.bfloat16) for i in range(40)}
    moved = {k: torch.ones(_N, dtype=torch.bfloat16) for k in old}
    sampled: list[int] = []
    real = delta_bits.estimated_density
    monkeypatch.setattr(delta_bits, "estimated_density",
                        lambda a, b: sampled.append(a.size) or real(a, b))
    return old, moved, sampled


def test_each_raw_sample_lowers_the_odds_of_sampling_the_next(monkeypatch):
    """all_raw on a version whose every element moved, over a link where each tensor alone is
    worth a sample at even odds: it stops sampling once the odds, lowered by every sample
    that found raw, no longer pay for one; it still says raw. A version whose first tensor
    is codable is caught by the first sample."""
    from storage.weights.tensor_form import all_raw

    n = _N
    link = tm.Link(2, 2)
    assert tm.raw_before_scan(2 * n, 2, 1.0, link)  # every element moved: raw is sooner
    assert tm.worth_sampling(2 * n, 2 * n, link)  # each alone: yes, at even odds
    assert not tm.worth_sampling(2 * n, 2 * n, link, odds=1 / 40)
    old, moved, sampled = _moved_everywhere(monkeypatch)
    assert all_raw(moved, old, link)
    assert len(sampled) > 1  # the first samples are taken at even odds, then fewer
    assert len(sampled) < len(old)  # not every tensor: the odds fell with each raw sample
    sampled.clear()
    assert not all_raw({k: t.clone() for k, t in old.items()}, old, link)  # nothing moved
    assert len(sampled) == 1
    # tiny tensors go raw unseen and are never looked at; a dtype the codec does not know
    # (complex) is never the dense path's version, wherever it sits
    tiny = {f"n{i}": torch.ones(8, dtype=torch.bfloat16) for i in range(5)}
    sampled.clear()
    assert all_raw(tiny, {k: t - 1 for k, t in tiny.items()}, link) and sampled == []
    odd = {**tiny, "c": torch.zeros(4, dtype=torch.complex64)}
    assert not all_raw(odd, odd, link)


def test_samples_that_found_raw_carry_over_to_the_next_publishes(monkeypatch):
    """A publisher's judge keeps its samples that found raw (RawSamples): publish after
    publish of a version whose every element moved it samples less, then not at all; a link
    much slower than theirs resets them, and a sample that finds coding worth it too."""
    from storage.weights.tensor_form import RawSamples, all_raw

    link = tm.Link(2, 2)
    old, moved, sampled = _moved_everywhere(monkeypatch)
    history, counts = RawSamples(), []
    for _ in range(4):
        sampled.clear()
        assert all_raw(moved, old, link, history)
        counts.append(len(sampled))
    assert counts[0] > 1 and counts[-1] == 0 and counts == sorted(counts, reverse=True)
    assert history.found == sum(counts)
    sampled.clear()
    assert all_raw({k: t.clone() for k, t in old.items()}, old, link, history)  # not looked at
    assert sampled == []
    slow = tm.Link(1, 2)  # half the rate: the samples no longer say much
    assert not all_raw({k: t.clone() for k, t in old.items()}, old, slow, history)
    assert len(sampled) == 1 and history.found == 0
    assert all_raw(moved, old, link, history) and history.found > 0  # sampled afresh


def test_streaming_order_puts_tensors_coded_in_blocks_last(monkeypatch):
    from storage.delta import blocks
    from storage.weights.tensor_form import streaming_order

    monkeypatch.setattr(blocks, "SPLIT_BYTES", 1 << 10)
    sizes = {"embed": 4096, "l0.q": 64, "l0.mlp": 1024, "l1.q": 64, "norm": 8}  # bf16 elements
    tensors = {n: torch.zeros(k, dtype=torch.bfloat16) for n, k in sizes.items()}
    out = streaming_order(tensors)
    assert list(out) == ["l0.q", "l1.q", "norm", "embed", "l0.mlp"]  # each group in model order
    assert all(out[n] is tensors[n] for n in tensors)  # the same tensors, not copies
    assert list(streaming_order({})) == []


def test_density_samples_are_evenly_spaced_windows():
    """bits.sample_rows: 16 windows spread over the whole tensor, read-only views; small
    tensors are counted whole; the estimate matches a hand count over those windows."""
    from storage.delta import bits as delta_bits

    assert delta_bits.sample_rows(torch.zeros(1000).numpy()) is None
    a = torch.arange(1 << 20, dtype=torch.int32).numpy()
    rows = delta_bits.sample_rows(a)
    w = delta_bits.SAMPLE_WINDOW
    assert rows.shape == (delta_bits.SAMPLE_WINDOWS, w) and not rows.flags.writeable
    assert rows[0, 0] == 0 and rows[-1, -1] <= a.size - 1 and rows[-1, -1] > a.size - w
    assert all((r == np.arange(r[0], r[0] + w)).all() for r in rows)
    b = a.copy()
    b[rows[3, 0]:rows[3, 0] + w // 2] += 1  # half of one window moved
    assert delta_bits.sampled_density(a, b) == pytest.approx(0.5 / delta_bits.SAMPLE_WINDOWS)
    assert delta_bits.sampled_elements(a.size) == rows.size
    assert delta_bits.sampled_elements(1000) == 1000


def test_bits_of_views_and_trainable_tensors():
    """to_bits reads the bits of a strided view (copied) and of a tensor that requires grad."""
    from storage.delta import bits as delta_bits

    t = torch.randn(8, 6).to(torch.bfloat16)
    want = t.contiguous().view(torch.int16).numpy().reshape(-1).view(np.uint16)
    assert (delta_bits.to_bits(t.t().contiguous().t()) == want).all()
    assert (delta_bits.to_bits(t.t()) == t.t().contiguous().view(torch.int16).numpy()
            .reshape(-1).view(np.uint16)).all()
    p = torch.nn.Parameter(t.float())
    assert delta_bits.to_bits(p).size == 48


def test_streams_says_what_the_publish_will_do(tmp_path, monkeypatch):
    """streams(): a full snapshot and an all-raw delta are not streamed, a coded delta is; the
    publish that follows reuses the verdict instead of judging the version again."""
    import storage.weights.sparse_publisher as sp

    old, new = versions()
    judged = []
    real = sp.all_raw
    monkeypatch.setattr(sp, "all_raw", lambda *a: judged.append(1) or real(*a))
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "plan", 1 << 20, link_gbps=1)
    assert not pub.streams(0, old)  # nothing held: a full snapshot
    pub.publish(0, old)
    assert pub.streams(1, new) and len(judged) == 1
    pub.publish(1, new)
    assert len(judged) == 1 and relay.exists("rose/plan/v1/announce")
    moved = {n: (t.float() * 1.5 + 1).to(torch.bfloat16) for n, t in new.items()}
    pub.link_gbps = 400  # every element moved, a fast link: all raw
    assert not pub.streams(2, moved)
    pub.publish(2, moved)
    assert len(judged) == 2 and not relay.exists("rose/plan/v2/announce")
    assert set(entry_encodings(relay, "plan", 2).values()) == {"raw"}
    pub.stream = False
    assert not pub.streams(3, new)


def test_config_link_rate_validated():
    assert PublishConfig().link_gbps > 0
    assert PublishConfig(link_gbps=0.5).link_gbps == 0.5
    for bad in (0, -1, 1e6):
        with pytest.raises(ValidationError):
            PublishConfig(link_gbps=bad)


@pytest.mark.parametrize("gbps,workers", [(1000.0, 1), (1000.0, 2), (0.01, 1), (0.01, 2)])
def test_publish_by_time_bit_exact(tmp_path, gbps, workers):
    relay = FilesystemRelay(tmp_path)
    fast = gbps > 100
    # on a fast link an update that moved most elements goes raw (on this model's costs a 2%
    # update of a 1 MB tensor is still worth coding at any rate: raw bytes' own trip costs)
    old, new = versions(moved=0.9 if fast else 0.02)
    pub = SparsePublisher(relay, "r", bucket_bytes=256 << 10, link_gbps=gbps, workers=workers)
    rx = WeightReceiver(relay, "r", full_timeout_s=1, workers=workers)
    pub.publish(0, old)
    rx.pull(0)
    report = pub.publish(1, new)
    got = rx.pull(1)
    assert got.mode == "delta" and not got.fallback
    assert all(bits(rx.tensors[n]) == bits(new[n]) for n in new)
    picked = entry_encodings(relay, "r", 1)
    assert picked["model.tiny"] == "raw"  # fixed costs dominate at any rate
    big = "model.embed_tokens.weight"
    if fast:  # a fast link and a dense update: nothing is worth coding
        assert set(picked.values()) == {"raw"}
        # decided before any encoding: sent as the dense path sends it, no per-tensor step
        assert all(t.encode_s == 0.0 for t in report.tensors)
        assert report.pushed_bytes >= sum(t.numel() * 2 for t in new.values())
    else:  # a slow link: the large tensors go coded, and far smaller
        assert picked[big] not in ("raw", "dense")
        assert report.pushed_bytes < sum(t.numel() * 2 for t in new.values()) / 4
    rows = {r["name"]: r for r in report.rows()}  # raw tensors' changes counted on reading
    assert rows[big]["changed"] == int((bits_of(new[big]) != bits_of(old[big])).sum())


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def test_no_link_rate_keeps_choosing_by_bytes(tmp_path):
    relay = FilesystemRelay(tmp_path)
    old, new = versions(1)
    pub = SparsePublisher(relay, "r")
    pub.publish(0, old)
    pub.publish(1, new)
    assert "raw" not in entry_encodings(relay, "r", 1).values()


def test_parallel_pull_equals_serial(tmp_path):
    relay = FilesystemRelay(tmp_path)
    old, new = versions(2)
    pub = SparsePublisher(relay, "r", bucket_bytes=128 << 10, workers=2)
    pub.publish(0, old)
    pub.publish(1, new)
    one = pull_weights(relay, "r", 1, base=old, base_version=0, workers=1)[1]
    two = pull_weights(relay, "r", 1, base=old, base_version=0, workers=2)[1]
    assert list(one) == list(two) == list(new)
    assert all(bits(one[n]) == bits(two[n]) == bits(new[n]) for n in new)


def test_ordered_map_order_chunks_and_errors():
    items = list(range(200))
    assert list(ordered_map(lambda x: x * x, items, 2, cost=lambda _: 1, chunk_bytes=7)) == \
        [x * x for x in items]
    assert list(ordered_map(lambda x: -x, items, 1)) == [-x for x in items]

    def boom(x: int) -> int:
        if x == 150:
            raise RuntimeError("bad tensor")
        return x

    seen = []
    with pytest.raises(RuntimeError, match="bad tensor"):
        for y in ordered_map(boom, items, 2, cost=lambda _: 1, chunk_bytes=10):
            seen.append(y)
    assert seen == items[:150]


def test_ordered_map_keeps_threads_busy_behind_a_slow_head():
    """One large tensor first (an embedding): the other thread goes on with the tensors behind
    it, up to `ahead_bytes` of work, instead of idling once `window` tasks are queued."""
    import threading

    def run(ahead_bytes: int) -> int:
        head_done, before = threading.Event(), []

        def fn(x: int) -> int:
            if x == 0:
                time.sleep(0.3)
                head_done.set()
            elif not head_done.is_set():
                before.append(x)
            return x
        out = list(ordered_map(fn, range(40), 2, cost=lambda _: 1, chunk_bytes=1,
                               ahead_bytes=ahead_bytes))
        assert out == list(range(40))
        return len(before)

    assert run(ahead_bytes=1000) == 39  # all the rest, while the head still ran
    assert run(ahead_bytes=0) <= 4      # bounded by the task window alone


def test_small_items_before_a_large_one_are_not_held_back_by_it():
    """A large item (cost >= chunk_bytes) is a task of its own: the small ones before it come
    out while it is still being worked on (a bucket of them can go on the link meanwhile)."""
    import threading

    consumed_small = threading.Event()

    def fn(x: int) -> int:
        if x == 2:  # the large one: finishes only once the consumer has the small ones
            assert consumed_small.wait(5), "the small items waited for the large one"
        return x
    out = []
    for y in ordered_map(fn, range(4), 2, cost=lambda x: 10 if x == 2 else 1, chunk_bytes=5):
        out.append(y)
        if y == 1:
            consumed_small.set()
    assert out == [0, 1, 2, 3]


def test_a_model_in_one_pool_task_is_judged_on_one_core(tmp_path):
    """The pool codes a model that fits in one task inline, so the time model is given one
    core for it, not every core: with two, it would expect coding to cost half what it does."""
    from storage.weights.parallel import CHUNK_BYTES, busy_workers

    assert busy_workers(1_700_000, 2) == 1
    assert busy_workers(CHUNK_BYTES + 1, 2) == 2 and busy_workers(100 * CHUNK_BYTES, 8) == 8
    assert busy_workers(0, 4) == 1
    pub = SparsePublisher(FilesystemRelay(tmp_path / "relay"), "r", link_gbps=1, workers=2)
    tiny = {"w": torch.zeros(1 << 10, dtype=torch.bfloat16)}
    big = {f"w{i}": torch.zeros(CHUNK_BYTES // 2, dtype=torch.bfloat16) for i in range(3)}
    assert pub._link(tiny) == tm.Link(1, 1)
    assert pub._link(big) == tm.Link(1, 2)
