"""Hardware affinity in the simulator (RollArt §4.1, Fig. 11a): a rollout fleet of device classes
(e.g. H800s tagged "compute", H20s tagged "bandwidth"), a batch mixing a prefill-heavy and a
decode-heavy environment, and the product's TurnRouter with its HwAffinity placing every turn.

A mixin-free subclass of ClusterSim: the fleet is rollout GPUs only (no serving GPUs lent), each
class with its own latency profile (measured, or derived by sim/roofline.py) and KV pool; the
batch is fixed per step whatever the fleet, so fleets of equal cost compare on equal work.
The workloads' parameters are chosen from RollArt's descriptions (below), not published numbers.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from executors.policies.hw_affinity import HwAffinity
from executors.policies.latency_profile import LatencyProfile
from executors.policies.router import TurnRouter, WorkerInfo
from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.device import Device
from sim.engine_cost import ContextCost
from sim.paper_workloads import PaperWorkload
from sim.serving import BLOCK
from sim.workload import WorkloadSpec

# RollArt §2.1 and Table 1: FrozenLake (text and visual) runs 20-100 turns and "frequent
# interactions force the agent LLM to repeatedly process the growing context history", so it is
# prefill-heavy; GEM-Math has "fewer turns (up to five) but ... longer chains of thought per
# action", decode-heavy. Medians and spreads are chosen (not published): 30 turns (Table 1's lower
# end: a small grid) of a 30-token move after a 300-token observation (the grid as text and
# image tokens); 2 turns of a 1,500-token reasoning; both within Qwen3-8B/32K's context.
FROZENLAKE = PaperWorkload("rollart_frozenlake", turns_median=30.0, response_median=30.0, response_sigma=0.5,
                           trajectory_sigma=0.3, turns_sigma=0.4, max_turns=100, first_prompt=800.0,
                           obs_tokens=300.0, env_s=0.2)
GEM_MATH = PaperWorkload("rollart_gem_math", turns_median=2.0, response_median=1500.0, response_sigma=0.5,
                         trajectory_sigma=0.5, turns_sigma=0.4, max_turns=5, first_prompt=300.0,
                         obs_tokens=100.0, env_s=0.1)
WORKLOADS = {"frozenlake": FROZENLAKE, "gem_math": GEM_MATH}
# RollArt's own mapping (Listing 1): FrozenLake on H800s, everything else on H20s
ROLLART_AFFINITY = HwAffinity({"frozenlake": "compute", "default": "bandwidth"})


@dataclass(frozen=True)
class DeviceClass:
    """`count` rollout GPUs of one class: their profile, long-context cost and KV pool."""

    device_class: str
    device: str  # its GPU's name, for the report
    count: int
    profile: LatencyProfile
    context: ContextCost
    kv_blocks: int | None
    cost: float  # per GPU

    def __post_init__(self) -> None:
        if self.count < 0 or self.cost <= 0:
            raise ValueError(f"{self.device_class}: count must be >= 0 and cost > 0")


class AffinitySim(ClusterSim):
    """One run: `batch` trajectories a step, `mix` (tag -> share) of them per environment."""

    def __init__(self, cfg: SimConfig, fleet: list[DeviceClass], mix: dict[str, float], batch: int,
                 affinity: HwAffinity | None, workloads: dict[str, PaperWorkload] = WORKLOADS) -> None:
        if not any(c.count for c in fleet):
            raise ValueError("the fleet has no rollout GPU")
        if batch < 1 or not mix or set(mix) - set(workloads) or any(s < 0 for s in mix.values()):
            raise ValueError(f"need batch >= 1 and shares >= 0 of known tags {sorted(workloads)}, got {mix}")
        self.fleet, self.batch, self.affinity = fleet, batch, affinity or HwAffinity()
        self.specs: dict[str, WorkloadSpec] = {t: workloads[t].spec() for t in mix}
        self.mix = {t: s / sum(mix.values()) for t, s in mix.items()}
        self.tags: dict[str, str] = {}
        self.class_of: dict[str, str] = {}
        self.placed: Counter = Counter()  # (tag, device class) -> turns
        super().__init__(cfg, next(iter(self.specs.values())), router=TurnRouter(cfg.cap_per_rollout_gpu,
                                                                                cfg.mode, affinity))

    def _build(self) -> None:
        self._elastic = []
        for cls in self.fleet:
            for i in range(cls.count):
                name = f"{cls.device.lower()}-{i}"
                self.devices[name] = Device(self.loop, name, "rollout", cls.profile, self._done, self._abort,
                                            context=cls.context, kv_pool=cls.kv_blocks, jump=self.cfg.event_jump)
                self.router.register_worker(WorkerInfo(name, "rollout", cls.device_class))
                self.class_of[name] = cls.device_class

    def _launch_step(self, step: int) -> None:
        self._index, self._groups, self._left = 0, {}, self.batch
        self._launch(step, self.batch, None)

    def _launch(self, step: int, n: int, group: int | None) -> None:
        counts = _apportion(self.mix, n)
        tags = [t for t, k in counts.items() for _ in range(k)]
        self.rng.shuffle(tags)  # environments interleaved in the queue, as a mixed batch arrives
        for tag in tags:
            traj = self.specs[tag].sample(self.rng)
            tid = f"s{step}-t{self._index}"
            self._index += 1
            self.tags[tid] = tag
            self.trajs[tid] = [traj, 0, traj.first_prompt, group]
            self.counts["started"] += 1
            self.queue.append(tid)

    def _dispatch(self) -> None:
        q, route = self.queue, self.router.route
        while q:
            name = route(q[0], self._admits, self.tags[q[0]])
            if name is None:
                return
            self._place(q.popleft(), name)

    def _place(self, tid: str, name: str) -> None:
        self.placed[self.tags[tid], self.class_of[name]] += 1
        super()._place(tid, name)

    def report(self) -> dict:
        """The run's rollout and step times, and where each environment's turns ran."""
        r = self.run()
        steps = r["per_step"]
        placed: dict[str, dict[str, float]] = {}
        for (tag, cls), n in sorted(self.placed.items()):
            placed.setdefault(tag, {})[cls] = n
        for tag, by_class in placed.items():
            total = sum(by_class.values())
            placed[tag] = {cls: n / total for cls, n in by_class.items()}
        return {"finished": r["finished"], "rollout_s": [s["rollout_s"] for s in steps],
                "step_s": [s["step_s"] for s in steps], "rollout_s_mean": r["rollout_s_mean"],
                "tokens": sum(s["tokens"] for s in steps), "turn_share_by_class": placed,
                "trajectories": r["trajectories_finished"], "in_flight": r["trajectories_in_flight"],
                "wall_s": r["wall_s"]}


def kv_blocks(memory_gb: float, params: int, kv_bytes_per_token: int, utilization: float = 0.9) -> int:
    """A dedicated rollout GPU's KV pool: vLLM's default share of memory after bf16 weights."""
    free = memory_gb * 1e9 * utilization - 2 * params
    if free <= 0:
        raise ValueError(f"{params:,} parameters do not fit in {memory_gb} GB")
    return int(free // (BLOCK * kv_bytes_per_token))


def _apportion(mix: dict[str, float], n: int) -> dict[str, int]:
    """n split by shares, largest remainders first: the batch's make-up is exact, not sampled."""
    raw = {t: s * n for t, s in mix.items()}
    out = {t: math.floor(x) for t, x in raw.items()}
    for t in sorted(raw, key=lambda t: raw[t] - out[t], reverse=True)[:n - sum(out.values())]:
        out[t] += 1
    return out
