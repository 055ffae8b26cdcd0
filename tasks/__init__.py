"""The RL step's phases as Prefect tasks, each small with explicit retries: rollout, reward,
train, publish and the serving report; what makes a phase reusable on resume (caching.py),
which Dask worker runs what (placement.py), and leaving a worker's thread pool without leaking
Prefect's context (worker_threads.py). They run on Dask workers. Tasks may import coordination,
executors, storage, core and envs; never replay, flows or rose (lint-imports checks the layers
rose > flows > tasks > coordination | replay > executors > storage > core | envs).
"""
