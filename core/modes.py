"""The modes a user picks by name, written once: turn routing, co-serving, engine device.

Plain Python, so the policies (executors/policies/router.py), the executors
(executors/coserving/config.py, executors/engine/device.py) and the pydantic config
(core/config.py) all take them from here.
"""
from __future__ import annotations

from typing import Literal, get_args

# how the rollout scheduler routes turns (executors/policies/router.py)
RoutingMode = Literal["turnwise_affinity", "turnwise", "pinned"]
ROUTING_MODES: tuple[str, ...] = get_args(RoutingMode)

# what a stack's serving workers run (paper Tables 1 and 2; executors/coserving/config.py WIRING)
StackServingMode = Literal["rose", "static_partition", "preemption", "prefix", "unaware"]
# and the co-serving bench's other two: no rollout engine at all (nothing to lend), and a
# rollout engine torn down on a burst (bench/coserving/coserving.py)
ServingMode = Literal[StackServingMode, "serving_only", "evict_reload"]
SERVING_MODES: tuple[str, ...] = get_args(ServingMode)

# where the engine workers' engines run (executors/engine/device.py)
Device = Literal["cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)
