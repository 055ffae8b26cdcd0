"""The simulator's shortcuts give the numbers of the plain computations they replace: the O(1)
serving engine (sim/serving.py) those of walking the batch every step, the inverse-CDF draw
np.interp's bits, the memoized profile curves the Curve's own evaluation."""
from __future__ import annotations

import math
import random

import numpy as np

from executors.policies.slo_admission import ServingDecode, ServingPrefill
from sim.profiles import load_profile, scaled
from sim.serving import BLOCK, MAX_SERVING_PREFILL, ServingEngine
from sim.workload import QUANTILES, ServingRequest, WorkloadSpec


class _Walk:
    """The pre-split engine (sim/device.py before sim/serving.py): every request walked each step."""

    def __init__(self, profile) -> None:
        self.profile, self.queued, self.active, self.done = profile, [], [], []

    def step(self, now: float) -> float:
        batch, tokens = [], 0
        for s in self.queued:
            if batch and tokens + s["req"].prompt > MAX_SERVING_PREFILL:
                break
            batch.append(s)
            tokens += s["req"].prompt
        del self.queued[:len(batch)]
        cost = self.profile.prefill(tokens) if batch else self.profile.decode_step(len(self.active))
        end = now + cost
        for s in self.active:
            s["left"] -= 1
            s["last"] = end
        for s in batch:
            s.update(first=end, last=end, left=s["req"].output - 1)
            self.active.append(s)
        for s in [s for s in self.active if s["left"] <= 0]:
            self.active.remove(s)
            self.done.append((s["first"] - s["req"].arrival, (s["last"] - s["first"]) / max(1, s["req"].output - 1)))
        return cost

    def blocks(self) -> int:
        return sum(math.ceil((s["req"].prompt + s["req"].output - s["left"]) / BLOCK) for s in self.active)


def test_serving_engine_matches_walking_the_batch():
    rng = random.Random(7)
    reqs, t = [], 0.0
    for _ in range(400):
        t += rng.expovariate(40.0)
        reqs.append(ServingRequest(t, rng.randint(1, 1500), rng.choice([1, 2, 31, 32, 33, rng.randint(1, 300)])))
    prof = scaled(load_profile("cpu_serving"), 1.0)
    engine, walk, now, steps = ServingEngine(prof, iter(reqs)), _Walk(prof), 0.0, 0
    pending = list(reqs)
    while engine.next is not None or engine.busy:
        if not engine.busy:
            now = max(now, engine.next.arrival)
        engine.take_arrivals(now)
        while pending and pending[0].arrival <= now:
            walk.queued.append({"req": pending.pop(0)})
        queued, active = engine.admission_view()
        assert queued == [ServingPrefill(s["req"].arrival, s["req"].prompt) for s in walk.queued]
        assert active == [ServingDecode(s["last"]) for s in walk.active]
        cost = engine.step(now)
        assert cost == walk.step(now)
        assert engine.blocks == walk.blocks() and engine.running == len(walk.active)
        now, steps = now + cost, steps + 1
    assert engine.stats.done == walk.done and len(walk.done) == len(reqs) and steps > 100


def test_inverse_cdf_draw_is_np_interp_bit_for_bit():
    spec = WorkloadSpec.load()
    for name, q in spec.q.items():
        a, b = random.Random(3), random.Random(3)
        for _ in range(5000):
            assert spec._draw(a, name) == float(np.interp(b.random(), QUANTILES, q))
        for x in QUANTILES[:-1]:  # exactly on a quantile: np.interp returns that value
            assert spec._draw(_Fixed(x), name) == float(np.interp(x, QUANTILES, q))


class _Fixed(random.Random):
    def __init__(self, x: float) -> None:
        super().__init__(0)
        self.x = x

    def random(self) -> float:
        return self.x


def test_memoized_curves_answer_as_the_curve_does():
    prof = scaled(load_profile("cpu_policy"), 1.7)
    plain = type(prof.decode).__mro__[1]
    for curve in (prof.monolithic, prof.chunked, prof.decode):
        ref = plain(curve.xs, curve.ys)
        for x in (0, 1, 3, 3.5, 64, 511, 512, 4096, 10**6, 3):
            assert curve(x) == ref(x)
