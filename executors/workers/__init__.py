"""Dask WorkerPlugins and the functions submitted to them: the dedicated rollout worker
(rollout_worker.py), the trainer (trainer.py; its megatron-core backend in executors.training)
and its publishers (publishers.py), and background weight sync (weight_sync.py). May import
executors.coserving (a serving worker runs turns and loads weights there), executors.training,
executors.engine, executors.policies, storage and rose (config, GRPO); never
executors.scheduling, tasks or flows.
"""
