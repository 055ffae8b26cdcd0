"""ROSE's operator side and its shared basics.

Basics every layer uses, importing no other ROSE package (lint-imports checks it): config.py
(pydantic RunConfig, StackConfig, ...), grpo.py (group advantages, the clipped loss, truncated importance weights),
worker_kinds.py (worker kind <-> Dask resource). models/ builds the tiny policy and serving
models locally. The operator side sits on top of everything: cli.py (`rose ...`, typer), launch.py
(starts runs), resume.py, deploy.py (Prefect deployments), stack/ (starts and stops the local
Prefect server, Mooncake, Dask scheduler and workers), serve/ (the serving trace replay).
"""
