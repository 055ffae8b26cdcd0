"""Step latencies of a Hugging Face model run with plain PyTorch, where no vLLM is installed.

A GPU machine lent without vLLM (and without the network to install it) can still measure
what the simulator needs of a GPU kind: prefill time against prompt length, whole and chunked,
and decode-step time against batch at a given context. Each forward is timed two ways:
eager (what `transformers` costs, Python and kernel launches included) and, on CUDA, as a
replayed CUDA graph of the same forward, which removes the per-kernel launch cost the way
vLLM's CUDA graphs do. Weights need not be trained (random weights time the same), and the
decode context is filled with random keys and values instead of a prefill, so a 32B model's
batch-256 point costs no prefill of 131k tokens.

Two things `transformers` does that an engine does not would otherwise dominate the numbers
(seen on an H100: graphed decode at batch 256 took twice the eager time): under graph capture
it materialises the causal mask, which sends SDPA to a kernel that copies every KV head to
every query head; and its growing cache concatenates the whole context at every decode step.
So attention here is SDPA with native grouped-query heads and no mask (causal within a
prompt; a chunk attends its whole prefix, which over-counts one chunk-square triangle), and
decode writes into a preallocated cache at a fixed position, as a paged engine does.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch


@dataclass
class ForwardTimes:
    """Median seconds per size, eager and graphed (graphed is empty where capture failed)."""

    eager: dict[int, float] = field(default_factory=dict)
    graphed: dict[int, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def fastest(self) -> dict[int, float]:
        """Per size, the faster of the two ways of running the same forward (each a real time on
        this device; an engine free to choose would take the faster)."""
        return {size: min(t, self.graphed.get(size, t)) for size, t in sorted(self.eager.items())}


class HFForwardTimer:
    """Times one model's prefill, chunked prefill and decode step on `device`."""

    def __init__(self, model, device: str, repeats: int = 3, decode_context: int = 512,
                 seed: int = 0) -> None:
        if repeats < 1 or decode_context < 1:
            raise ValueError(f"need repeats >= 1 and decode_context >= 1, got {repeats}, {decode_context}")
        self.model, self.device, self.repeats = model.eval(), device, repeats
        self.decode_context = decode_context
        cfg = model.config
        self.vocab = cfg.vocab_size
        self.layers = cfg.num_hidden_layers
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.cuda = device.startswith("cuda")

    # -- the forwards being timed ---------------------------------------------------------
    def _ids(self, batch: int, length: int) -> torch.Tensor:
        return torch.randint(3, self.vocab, (batch, length), generator=self.gen).to(self.device)

    def _forward(self, ids: torch.Tensor, cache, position: torch.Tensor | None = None) -> None:
        # logits of the last position only, as an engine computes them for sampling
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                   cache_position=position)

    def _prefill_fn(self, length: int, chunk: int | None):
        ids = self._ids(1, length)
        step = chunk or length

        def run() -> None:
            cache = _new_cache(self.model.config)
            for start in range(0, length, step):
                self._forward(ids[:, start:start + step], cache)
        return run

    def _cached_step_fn(self, batch: int, context: int, new_tokens: int = 1):
        """One forward of `new_tokens` per request for `batch` requests that each hold `context`
        cached tokens: a decode step (1 new token) or a prefill chunk after a cached prefix."""
        from transformers import StaticCache
        cache = StaticCache(config=self.model.config, max_cache_len=context + new_tokens)
        shape = (batch, self.kv_heads, context, self.head_dim)
        dtype = next(self.model.parameters()).dtype
        for layer in range(self.layers):  # a filled context without paying its prefill
            k = torch.randn(shape, dtype=dtype, device=self.device)
            cache.update(k, torch.randn_like(k), layer)
        ids = self._ids(batch, new_tokens)
        position = torch.arange(context, context + new_tokens, device=self.device)

        def run() -> None:
            self._forward(ids, cache, position)
            for layer in cache.layers:  # every run writes into the same slots (a kernel, capturable)
                layer.cumulative_length.fill_(context)
        return run

    def _decode_fn(self, batch: int):
        return self._cached_step_fn(batch, self.decode_context)

    # -- timing -----------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _eager(self, run) -> float:
        run()  # warm-up: first shapes pay kernel selection and allocator growth
        samples = []
        for _ in range(self.repeats):
            self._sync()
            t0 = time.perf_counter()
            run()
            self._sync()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    def _graphed(self, run) -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        graph.replay()
        samples = []
        for _ in range(self.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1000)
        del graph
        return statistics.median(samples)

    def _time(self, make_run, sizes, label: str) -> ForwardTimes:
        out, graphs_ok = ForwardTimes(), self.cuda
        for size in sizes:
            try:
                with torch.inference_mode():
                    out.eager[size] = self._eager(make_run(size))
            except torch.OutOfMemoryError:
                out.errors.append(f"{label} {size}: out of memory; curve stops before it")
                break
            if not graphs_ok:
                continue
            try:
                with torch.inference_mode():
                    out.graphed[size] = self._graphed(make_run(size))
            except Exception as e:  # noqa: BLE001 - capture failure is data: eager stays
                out.errors.append(f"{label} {size}: CUDA graph capture failed: {str(e)[:200]}")
                out.graphed.clear()
                graphs_ok = False
            if self.cuda:
                torch.cuda.empty_cache()
        return out

    def prefill(self, lengths, chunk: int | None = None) -> ForwardTimes:
        label = f"prefill chunk {chunk}" if chunk else "prefill"
        return self._time(lambda L: self._prefill_fn(L, chunk), lengths, label)

    def decode(self, batches) -> ForwardTimes:
        return self._time(self._decode_fn, batches, "decode")

    def after_context(self, contexts, batch: int = 1, new_tokens: int = 1) -> ForwardTimes:
        """Per cached context length: a step of `new_tokens` per request for `batch` requests
        (1: a decode step; more: a prefill chunk attending the cached prefix)."""
        if batch < 1 or new_tokens < 1 or any(c < 1 for c in contexts):
            raise ValueError(f"need batch, new tokens and contexts >= 1, got {batch}, {new_tokens}, {list(contexts)}")
        return self._time(lambda c: self._cached_step_fn(batch, c, new_tokens), contexts,
                          f"{new_tokens} new x {batch} after context")


def _timing_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs):
    """SDPA with grouped-query heads and no mask: causal within a prompt, else the whole prefix."""
    q_len, k_len = query.shape[2], key.shape[2]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=q_len == k_len and q_len > 1, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs) -> None:
    return None


TIMING_ATTENTION = "rose_timing_sdpa"


def _register_timing_attention() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    AttentionInterface.register(TIMING_ATTENTION, _timing_attention)
    AttentionMaskInterface.register(TIMING_ATTENTION, _no_mask)


def _new_cache(config):
    from transformers import DynamicCache
    return DynamicCache(config=config)


def build_random_model(config_path, device: str, dtype: torch.dtype = torch.bfloat16, **overrides):
    """A model of the given architecture (config.json, fields replaced by `overrides`, e.g. fewer
    layers) with random weights, made on `device`."""
    import json
    from pathlib import Path

    from transformers import AutoConfig, AutoModelForCausalLM
    _register_timing_attention()
    fields = {**json.loads((Path(config_path) / "config.json").read_text()), **overrides}
    fields.pop("layer_types", None)  # per-layer lists follow num_hidden_layers when rebuilt
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation=TIMING_ATTENTION)
    finally:
        torch.set_default_dtype(previous)
    return model.to(dtype)
