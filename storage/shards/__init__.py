"""Tensor-parallel / pipeline-parallel shard rules (rules.py), which slice each rank holds and its
relay key (layout.py), transfer plans between layouts (plan.py), and what a sharded trainer
publishes as objects grouped into parts, and which of them each receiver rank pulls (grain.py).
Pure tensor bookkeeping: imports nothing else of storage.
"""
