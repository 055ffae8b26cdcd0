"""What makes a phase's result reusable on resume: its run, its step, and the task's source.

A resumed or retried rl_step computes the same key for a phase that already completed and gets
the persisted result back (state `Cached`) instead of recomputing it. The key deliberately
ignores the operational part of the config (how many steps the run is asked to reach, where the
stack is, the relay's transport, test-only fault injection), so `rose resume --steps 10` or a
resume on a restarted stack still finds the earlier results; anything that changes what a phase
computes (seed, models, rollout or train settings) or the task's code gives a new key.

Results are small dicts (metrics + paths); trajectories and checkpoints stay on disk and are
passed by reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect.cache_policies import TASK_SOURCE, CachePolicy
from prefect.utilities.hashing import hash_objects

# RunConfig fields that change how a run is operated, never what a phase of a step computes.
OPERATIONAL_FIELDS = frozenset({"steps", "checkpoint_every", "stack", "publish", "borrow",
                                "fault_injection"})


def config_identity(cfg: Any) -> dict:
    """The part of a RunConfig that a phase's output depends on (JSON-able)."""
    return cfg.model_dump(mode="json", exclude=set(OPERATIONAL_FIELDS))


@dataclass
class RunStepInputs(CachePolicy):
    """Key: run id, step, config identity and every other input of the task (e.g. policy version).

    A task using it must take `cfg` (a RunConfig) and `step`; without them no key is computed
    and the task never caches (safer than caching on a partial key).
    """

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any],
                    flow_parameters: dict[str, Any], **kwargs: Any) -> str | None:
        cfg, step = (inputs or {}).get("cfg"), (inputs or {}).get("step")
        if cfg is None or step is None or not hasattr(cfg, "model_dump"):
            return None
        others = {k: v for k, v in inputs.items() if k not in ("cfg", "step")}
        return hash_objects(cfg.run_id, int(step), config_identity(cfg), others,
                            raise_on_failure=True)


STEP_CACHE = RunStepInputs() + TASK_SOURCE
