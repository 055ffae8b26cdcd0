"""Long-lived work on Dask workers, by layer (lower layers never import higher ones; lint-imports
checks it): `policies` (plain-Python decisions) < `engine` (vLLM) < `coserving` (the co-serving
executor) and `training` (the megatron-core trainer) < `workers` (rollout worker, trainer,
weight sync) < `scheduling` (the rollout dispatch loop). `turns.py` (the turn request/result
records) is shared by all of them. Executors may import storage, core (config, chat format, GRPO
maths) and envs, never coordination, replay, tasks, flows or rose.
"""
