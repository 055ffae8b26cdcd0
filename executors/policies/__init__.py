"""Plain-Python policies the executors run and tests and simulations drive directly: turn routing,
hardware affinity and the load index, KV memory, dual-SLO admission (of rollout steps; of serving
requests at the endpoint), step plans, latency profiles, stall detection,
dynamic sampling, the evict/reload autoscaling baseline, borrowing serving workers, co-execution
groups (runs sharing rollout and trainer pools under a phase-level round robin).
May import executors.turns, storage and numpy; never torch (none needs it), vLLM,
Dask/distributed, Prefect, Mooncake, a web server, or another executors sub-package.
Nothing here reads a clock on its own: callers pass `now`.
"""
