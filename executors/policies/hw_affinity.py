"""Hardware affinity (RollArt's first principle): an environment tag names the device class its
turns prefer, e.g. {"frozenlake": "compute", "default": "bandwidth"}: long-horizon, prefill-heavy
environments on compute-rich GPUs, decode-heavy ones on bandwidth-rich GPUs. A rollout worker's
class is part of its kind (WorkerInfo.device_class); after the cache-affine worker (a prefix
cache outweighs the class), the router tries the preferred class and falls back to any worker
when every one of that class is at its cap (executors/policies/router.py).

A mapping that names a class no worker has is refused when the run starts (`check`): its turns
would silently always fall back, which is the misconfiguration the user wants to hear about.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_TAG = "default"  # the class of every tag the mapping does not name
STANDARD_CLASS = "standard"  # a worker's class when none is configured: one class, nothing changes


class AffinityError(ValueError):
    """hw_affinity names a device class no worker has."""


@dataclass(frozen=True)
class HwAffinity:
    classes: Mapping[str, str] = field(default_factory=dict)  # environment tag -> device class

    def __post_init__(self) -> None:
        for tag, cls in self.classes.items():
            if not tag or not cls:
                raise ValueError(f"hw_affinity: empty tag or class in {dict(self.classes)}")
        object.__setattr__(self, "classes", dict(self.classes))

    def preferred(self, tag: str | None) -> str | None:
        """The class a turn of environment `tag` prefers; None: no preference (any worker)."""
        if tag is not None and tag in self.classes:
            return self.classes[tag]
        return self.classes.get(DEFAULT_TAG)

    def check(self, worker_classes: Iterable[str]) -> None:
        """Refuse a mapping naming a class none of `worker_classes` is, in one line."""
        have = sorted(set(worker_classes))
        missing = {t: c for t, c in self.classes.items() if c not in have}
        if missing:
            named = ", ".join(f"{t} -> {c}" for t, c in sorted(missing.items()))
            raise AffinityError(f"rollout.hw_affinity maps {named}, but no rollout worker has that class; "
                                f"the workers' classes: {', '.join(have) or 'none'}")
