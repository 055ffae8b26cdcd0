"""ROSE's shared basics, the bottom layer: every other ROSE package may import them, they import
no other ROSE package (lint-imports checks it).

config.py (the pydantic RunConfig, StackConfig, ...), modes.py (the modes a user picks by name),
grpo.py (group advantages, the clipped loss, truncated importance weights), worker_kinds.py
(worker kind <-> Dask resource), chat.py (the token-level chat format), trace.py (reading a
serving trace and planning the replay of a window of it).
"""
