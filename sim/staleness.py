"""The weight-sync staleness rule, mirrored from executors.workers.weight_sync.policy_floor.

That module imports torch and Dask, which the simulator may not (sim/__init__.py); the rule
itself is three lines of arithmetic. tests/test_sim_policies.py checks this copy against the
real function over a grid, so the two cannot drift apart silently.
"""
from __future__ import annotations


def policy_floor(step: int, max_staleness: int, worker_kind: str) -> int:
    """The oldest policy version a turn of `step` may run on (step s rolls out with s-1; a
    borrowed serving worker may lag by max_staleness versions while its pull completes)."""
    if step < 1 or max_staleness < 0:
        raise ValueError(f"step must be >= 1 and max_staleness >= 0, got {step}, {max_staleness}")
    lag = max_staleness if worker_kind == "serving" else 0
    return max(0, step - 1 - lag)
