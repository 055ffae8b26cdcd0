"""ROSE's operator side, on top of every other package: cli.py (`rose ...`, typer), config_file.py
(a run config from YAML files and flags), launch.py (starts runs), resume.py, deploy.py (Prefect
deployments), stack/ (starts and stops the local Prefect server, Mooncake, Dask scheduler and
workers, and the reward pool's controller) and models/ (builds the tiny policy and serving models
locally). Nothing below imports rose (lint-imports checks the layers rose > flows > tasks >
coordination | replay > executors > storage > core | envs).
"""
