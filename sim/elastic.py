"""Resource-elastic baselines (RLBoost+-like, serverless RL; ROSE paper §6): each RL step, as
many external GPUs as ROSE may borrow join rollout as dedicated engines, `elastic_alloc_s`
after the step starts (instances started, weights of the step's policy loaded), and leave when
its rollout ends. The serving GPUs only serve. A mixin of ClusterSim (sim/cluster.py).

The allocation time is a configuration, not a result: the paper measures these systems'
overhead at 6.8-26.1% of the step, which this model turns into seconds of the critical path
only where the fixed GPUs alone would not have finished by then.
"""
from __future__ import annotations

from executors.policies.router import WorkerInfo
from sim.device import Device
from sim.engine_cost import ContextCost


class ElasticSide:
    def _build_elastic(self, ctx: ContextCost) -> None:
        c = self.cfg
        self._elastic: list[Device] = []
        if c.config != "elastic":
            return
        for j in range(c.serving_gpus):
            dev = Device(self.loop, f"elastic-{j}", "rollout", self.rollout_prof, self._done, self._abort,
                         context=ctx, kv_pool=c.rollout_kv_blocks, jump=c.event_jump)
            dev.borrowed = True  # not the job's own GPUs: their tokens count as borrowed
            self.devices[dev.name] = dev
            self._elastic.append(dev)

    def _allocate_elastic(self, now: float) -> None:
        if self._elastic and self.cfg.elastic_alloc_s == 0:
            self._elastic_joined(self._step)  # before the batch is placed
        elif self._elastic:
            self.loop.at(now + self.cfg.elastic_alloc_s, self._elastic_joined, self._step)

    def _elastic_joined(self, step: int) -> None:
        if step != self._step or len(self.steps) >= step:  # that step's rollout already ended
            return
        for dev in self._elastic:
            self.router.register_worker(WorkerInfo(dev.name, "rollout"))
        self._dispatch()

    def _release_elastic(self) -> None:
        """The step's rollout ended (every trajectory done): the external GPUs go back."""
        for dev in self._elastic:
            if any(w.name == dev.name for w in self.router.workers()):
                self.router.remove_worker(dev.name)
