"""Worker kinds and the Dask resource each kind's workers carry, written once.

The stack tags each worker with its kind's resource (rose/stack/dask_cluster.py); tasks find
workers by kind from those resources (tasks/placement.py).
"""
from __future__ import annotations

# env: CPU-only workers hosting environment instances (executors/workers/env_host.py);
# reward: CPU-only workers of the elastic reward pool (executors/workers/reward_host.py)
KIND_RESOURCE: dict[str, str] = {"trainer": "train_gpu", "rollout": "rollout_gpu",
                                 "serving": "serving_gpu", "env": "env_cpu", "reward": "reward_cpu"}
KIND_OF_RESOURCE: dict[str, str] = {resource: kind for kind, resource in KIND_RESOURCE.items()}
# a rollout worker's device class (rollout.hw_affinity) rides as one more resource: hw_<class>=1
CLASS_RESOURCE_PREFIX = "hw_"
