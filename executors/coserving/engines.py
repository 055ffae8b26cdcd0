"""Build (and tear down) the co-serving executor's two in-process engines, with their profiles.

Serving engine: prefix caching on, whole-prompt (monolithic) prefill. Rollout engine: prefix
caching as the mode says; its prefill is chunked per step by the executor's token budget.
Both run BudgetedScheduler. Each engine is profiled once per model, settings and machine
(executors/coserving/profile.py); a rebuild after an eviction reads the cached profile.
"""
from __future__ import annotations

import gc

from executors.coserving.config import CoServingConfig
from executors.coserving.profile import EngineTimer, load_or_measure, measure_engine, profile_path
from executors.policies.latency_profile import LatencyProfile
from executors.engine.budgeted_scheduler import build_budgeted_engine, release_engine


def open_engine(cfg: CoServingConfig, which: str) -> tuple[object, object, LatencyProfile, str]:
    """(engine, scheduler, profile, "cached" | "measured") for which = "serving" | "rollout"."""
    if which not in ("serving", "rollout"):
        raise ValueError(f"engine must be 'serving' or 'rollout', got {which!r}")
    model_dir = cfg.serving_model_dir if which == "serving" else cfg.rollout_model_dir
    prefix = True if which == "serving" else cfg.wiring.prefix_cache
    engine, scheduler = build_budgeted_engine(
        model_dir, prefix_caching=prefix, max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs, kv_blocks=cfg.kv_blocks, seed=cfg.seed,
        role=which)  # its share of the device (executors/engine/device.py); serving opens first
    settings = {"max_model_len": cfg.max_model_len, "chunk_tokens": cfg.chunk_tokens,
                "max_num_seqs": cfg.max_num_seqs, "block_size": scheduler.block_size,
                "repeats": cfg.profile_repeats, "sampling": which}
    path = profile_path(model_dir, settings)
    vocab = engine.model_config.get_vocab_size()

    def measure() -> LatencyProfile:
        return measure_engine(engine, scheduler, vocab_size=vocab, max_model_len=cfg.max_model_len,
                              chunk_tokens=cfg.chunk_tokens, max_batch=cfg.max_num_seqs,
                              name=f"{which}:{model_dir.name}", repeats=cfg.profile_repeats,
                              rollout=which == "rollout")

    try:
        profile, source = load_or_measure(path, measure)
        if source == "cached":  # first shapes and compiled sampling kernels, before serving
            timer = EngineTimer(engine, scheduler, vocab, rollout=which == "rollout")
            timer.warm_up(cfg.chunk_tokens, cfg.max_model_len)
    except BaseException:
        release_engine(engine)
        raise
    if prefix:
        engine.reset_prefix_cache()  # profiling prompts are noise in the cache
    return engine, scheduler, profile, source


def shutdown_rollout(side) -> None:
    """Stop a rollout side's engine and let its memory go (evict/reload, close)."""
    engine = side.engine
    side.engine = side.scheduler = None
    release_engine(engine)
    del engine
    gc.collect()

