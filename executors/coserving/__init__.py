"""The co-serving executor: a serving model and a rollout model on one device, serving first.
executor.py (public API and control loop), step_gate.py (admit a rollout step or not),
memory.py (KV usage, the memory policy, evict/reload), serving_side.py, rollout_side.py and
rollout_turn.py (the two engines' requests), engines.py, profile.py, config.py, metrics.py;
plugin.py is its Dask side (registration.py puts it on a scheduler and asks the serving
workers) and endpoint/ its OpenAI-compatible HTTP server. May import executors.engine,
executors.policies, executors.turns, storage and core; never workers, scheduling, tasks or
flows.
"""
