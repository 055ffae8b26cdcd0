"""Tensor-parallel / pipeline-parallel shard rules (rules.py), which slice each rank holds and its
relay key (layout.py), and transfer plans between layouts (plan.py). Pure tensor bookkeeping:
imports nothing else of storage.
"""
