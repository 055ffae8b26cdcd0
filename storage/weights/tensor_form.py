"""How each tensor of a version goes out, by time (storage/delta/time_model.py): raw or coded,
decided before the change scan where possible, and the per-tensor stats a publish reports.
Plain functions over tensors and a link; storage/weights/sparse_publisher.py drives them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from storage.delta import bits, blocks, time_model
from storage.delta.bits import DTYPE_CODES
from storage.shards.layout import layer_index
from storage.weights.transfer_metrics import PublishReport, TensorStat


@dataclass
class RawSamples:
    """Density samples that found raw sooner, over a run's publishes on about the same link:
    the odds that the next finds coding worth it stay low from one version to the next (a
    GRPO run's small policy moves most of its elements every step), so a publisher that
    keeps them stops sampling once a sample costs more than coding could be expected to save.
    Back to none when a sample finds coding worth it, or the link is much slower than when
    they were taken (coding then pays more)."""

    found: int = 0
    gbps: float = 0.0  # the slowest link they were taken on

    def prior(self, link: time_model.Link) -> int:
        """How many of them count for a judge on this link (none once it is much slower)."""
        if link.gbps < SLOWER * self.gbps:
            self.found = 0
        if self.found == 0 or link.gbps < self.gbps:
            self.gbps = link.gbps
        return min(self.found, MAX_FOUND)


SLOWER = 0.67  # a link this much slower than the samples' resets them
MAX_FOUND = 62  # odds never below 1 in 64: a large tensor is still looked at now and then


def all_raw(tensors: dict[str, torch.Tensor], base: dict[str, torch.Tensor],
            link: time_model.Link, history: RawSamples | None = None) -> bool:
    """True when the time model sends every tensor raw before any scan (a tiny model, a fast
    link, most elements moved): the version then goes out exactly as the dense path sends it,
    with no per-tensor encoding step at all, so choosing by time costs nothing over dense.
    Stops at the first tensor worth coding (on a large model, the first one or two). Which
    tensors the sizes alone send raw is worked out once per model shape and link; only the
    others are looked at. Each sample that finds raw lowers the odds that the next finds
    coding worth it (Laplace's rule of succession: 1 / (samples + 2)), so a version whose
    every element moved stops being sampled once what coding could still save is smaller
    than a sample's cost. `history`: the samples of earlier publishes count too (updated)."""
    names = list(tensors)
    sizes = tuple((t.numel(), t.element_size()) if t.dtype in DTYPE_CODES else (-1, 0)
                  for t in tensors.values())
    prior = history.prior(link) if history is not None else 0
    samples = 0
    for i in _not_raw_unseen(sizes, link):
        if sizes[i][0] < 0:
            return False  # a dtype the codec does not know: not the dense path's version
        raw, density = _verdict(tensors[names[i]], base[names[i]], link,
                                1 / (prior + samples + 2))
        if not raw:
            if history is not None and density is not None:
                history.found = 0
            return False
        samples += density is not None
    if history is not None:
        history.found += samples
    return True


@functools.lru_cache(maxsize=64)
def _not_raw_unseen(sizes: tuple[tuple[int, int], ...], link: time_model.Link) -> tuple[int, ...]:
    """Indices of the tensors of these (numel, itemsize) that the sizes alone do not send raw
    (numel -1: not a codec dtype)."""
    return tuple(i for i, (numel, itemsize) in enumerate(sizes)
                 if numel < 0 or not _raw_unseen(numel, itemsize, link))


def streaming_order(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors in the order a coded delta goes out: those coded in blocks (an embedding,
    a quarter of a small model) last, the rest in model order. Payloads leave the encoders in
    order, so a large tensor at the head held every bucket behind it, and the streaming
    receiver idle, until its blocks were done; at the tail its blocks still spread over every
    core, while the buckets before them are applied."""
    return dict(sorted(tensors.items(),
                       key=lambda item: blocks.splits(item[1].numel() * item[1].element_size())))


def record_tensor(report: PublishReport, compare: dict[str, torch.Tensor] | None, name: str,
                  tensor: torch.Tensor, encoding: str, encoded_bytes: int, changed: int | None,
                  seconds: float) -> None:
    """One tensor's TensorStat; its changed elements are counted when the report is read
    (off the push path) unless the encoder already knows them."""
    ref = None if compare is None else compare.get(name)
    stat = _stat(name, tensor, encoding, encoded_bytes, changed, seconds)
    if changed is None and ref is not None and ref.shape == tensor.shape \
            and ref.dtype == tensor.dtype:
        report.defer_changed(stat, tensor, ref)
    report.tensors.append(stat)


def record_raw(report: PublishReport, compare: dict[str, torch.Tensor],
               tensors: dict[str, torch.Tensor]) -> None:
    """record_tensor of a delta sent all raw (`compare` holds every tensor, same shapes and
    dtypes): one loop, no per-tensor checks, as it runs on every publish of a small model."""
    for name, tensor in tensors.items():
        stat = _stat(name, tensor, "raw", None, None, 0.0)
        report.defer_changed(stat, tensor, compare[name])
        report.tensors.append(stat)


def _stat(name: str, tensor: torch.Tensor, encoding: str, encoded_bytes: int | None,
          changed: int | None, seconds: float) -> TensorStat:
    """TensorStat of one tensor; `encoded_bytes` None: its raw size; `changed` None: every
    element, until the deferred count replaces it."""
    numel = tensor.numel()
    nbytes = numel * tensor.element_size()
    layer = layer_index(name)
    return TensorStat(name, -1 if layer is None else layer, numel,
                      numel if changed is None else changed, encoding, nbytes,
                      nbytes if encoded_bytes is None else encoded_bytes, seconds)


def raw_first(new: torch.Tensor, old: torch.Tensor, link: time_model.Link
              ) -> tuple[bool, float | None]:
    """The time model's verdict before the change scan, from a sampled density (not even
    sampled when raw beats coding nothing at all, tiny tensors and fast links, or when
    coding could save less than the sample costs): (raw?, the density it sampled, None if
    none), which encode_delta's chooser then need not sample again."""
    return _verdict(new, old, link, 0.5)


def _verdict(new: torch.Tensor, old: torch.Tensor, link: time_model.Link,
             odds: float) -> tuple[bool, float | None]:
    """raw_first at `odds` that a sample finds coding worth it."""
    size = new.element_size()
    numel = new.numel()
    nbytes = numel * size
    if _raw_unseen(numel, size, link) or (odds < 0.5 and not time_model.worth_sampling(
            nbytes, bits.sampled_elements(numel) * size, link, odds)):
        return True, None
    density = bits.estimated_density(bits.to_bits(new), bits.to_bits(old))
    return time_model.raw_before_scan(nbytes, size, density, link), density


def raw_unseen(tensor: torch.Tensor, span: tuple[int, int] | None,
               link: time_model.Link | None) -> bool:
    """True when the piece (`tensor`, or its flattened elements `span`) goes raw on its sizes
    alone: a dtype the codec does not know, or raw_first's verdict without a sample."""
    if link is None:
        return tensor.dtype not in DTYPE_CODES
    numel = tensor.numel() if span is None else span[1] - span[0]
    return tensor.dtype not in DTYPE_CODES or _raw_unseen(numel, tensor.element_size(), link)


@functools.lru_cache(maxsize=4096)  # a model's tensors come in a few shapes
def _raw_unseen(numel: int, itemsize: int, link: time_model.Link) -> bool:
    """True when raw_first says raw without a sample (it depends on the sizes alone)."""
    nbytes = numel * itemsize
    return time_model.raw_before_scan(nbytes, itemsize, 0.0, link) or \
        not time_model.worth_sampling(nbytes, bits.sampled_elements(numel) * itemsize, link)
