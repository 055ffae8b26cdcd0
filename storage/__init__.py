"""Data at rest and in transit, knowing no orchestration: the trajectory dataset (trajectories/),
the per-step metric tables and TensorBoard events (metrics/), both as DuckDB views (catalog.py),
the weight relay (relay/), weight publishing and pulling (weights/), the sparse delta codec
(delta/), shard rules and layouts (shards/), checkpoints, the one atomic file write
(atomic.py) and the one count of the cores a pool may use (cores.py). Never imports executors,
tasks, flows, Dask, Prefect or vLLM (lint-imports checks it).
"""
