"""A tiny deterministic discrete-event check: admission + memory policy + stall detector driven
through a serving burst, the way the co-serving executor's control loop drives them.

Ground truth is the simulation's own state; the asserted properties are:
- every admitted rollout step had cost <= slack at decision time, and that slack, recomputed here
  from the raw request times, covers every queued prefill's TTFT and active decode's TPOT;
- a rollout step admitted between two serving decode steps never makes a TPOT gap exceed T_tpot;
- no rollout allocation ever cut serving's free blocks below the reserve or exceeded the budget;
- the burst triggers a cut that aborts rollout requests (rerouted), the budget does not grow
  until the next RL step, and the next step resets it.
"""
import math
import random
from dataclasses import dataclass

from executors.policies.kv_memory import KVMemoryPolicy, MemoryState
from executors.policies.latency_profile import Curve, LatencyProfile
from executors.policies.slo_admission import (
    DualSLOAdmission, ServingDecode, ServingPrefill, SLOConfig, rollout_step_cost,
)
from executors.policies.stall import StallDetector

BLOCK = 16  # tokens per KV block
SERVING = LatencyProfile(Curve((100, 2000), (0.01, 0.2)), Curve((100, 2000), (0.012, 0.24)),
                         Curve((1, 32), (0.01, 0.041)))
ROLLOUT = LatencyProfile(Curve((64, 512), (0.006, 0.03)), Curve((64, 512), (0.008, 0.04)),
                         Curve((1, 16), (0.006, 0.021)))
SLO = SLOConfig(ttft_s=0.5, tpot_s=0.1)
END, BURST, NEXT_STEP = 20.0, (8.0, 10.0), 15.0


def blocks(tokens: int) -> int:
    return math.ceil(tokens / BLOCK)


@dataclass
class Serving:
    arrival: float
    prompt: int
    out: int
    generated: int = 0
    last: float = 0.0
    gap_rollout: bool = False  # a rollout step ran since the last token
    gap_prefill: bool = False  # a serving prefill ran since the last token (serving's own delay)


@dataclass
class Rollout:
    rid: str
    traj: str
    todo: int  # prompt tokens still to prefill
    out: int
    kv: int = 0  # tokens in KV
    generated: int = 0


def arrivals() -> list[Serving]:
    rng, t, out = random.Random(1), 0.0, []
    while t < END:
        rate = 25.0 if BURST[0] <= t < BURST[1] else 1.5
        t += rng.expovariate(rate)
        out.append(Serving(t, rng.randint(200, 1500), rng.randint(10, 40)))
    return out


def test_burst_keeps_admitted_rollout_within_slack_and_headroom():
    adm = DualSLOAdmission(SERVING, SLO, "mixed")
    mem = KVMemoryPolicy(total_blocks=1500, reserve_fraction=0.2, high_watermark=0.5, lease_s=5.0)
    stalls = StallDetector(timeout_s=2.0)
    pending, queued, active = arrivals(), [], []
    ready = {f"t{i}": 0.0 for i in range(10)}  # trajectory -> time its next turn is ready
    running: dict[str, Rollout] = {}
    ctx = {t: 600 for t in ready}  # tokens of each trajectory's context so far
    now, n_turns, hits, expired, stepped, recent = 0.0, 0, 0, 0, False, []
    mem.start_step(300, now)
    admitted, refused, rerouted, tpot_checked, budgets = [], [], [], 0, []

    def serving_blocks() -> int:  # serving reserves prompt + output KV at admission (no preemption)
        return sum(blocks(r.prompt + r.out) for r in active)

    def reroute(rid: str, why: str) -> None:
        r = running.pop(rid)
        mem.on_rollout_free(rid)
        stalls.on_finish(rid)
        mem.drop_prefix(r.traj)
        ready[r.traj] = now + 1.0  # the scheduler runs the turn elsewhere, a later turn comes back
        rerouted.append((rid, why))

    while now < END:
        while pending and pending[0].arrival <= now:
            queued.append(pending.pop(0))
        recent = [(t, b) for t, b in recent if t >= now - 2.0] + [(now, serving_blocks())]
        if not stepped and now >= NEXT_STEP:  # next RL step: budget from the last 2 s of serving
            stepped = True
            mem.start_step(max(b for _, b in recent), now)
        expired += len(mem.expired_leases(now))  # the executor frees those blocks in the engine
        for report in stalls.check(now):
            reroute(report.request_id, "stall")
        for t, at in ready.items():  # next turns arrive on this worker (at most 6 running)
            if at <= now and len(running) < 6:
                prompt = ctx[t] + 100  # the environment's observation is appended
                rid, n_turns = f"{t}-{n_turns}", n_turns + 1
                cached = mem.drop_prefix(t)  # a live lease: the prefix KV moves into the request
                running[rid] = Rollout(rid, t, prompt - cached * BLOCK, 20, kv=cached * BLOCK)
                if cached:
                    hits += 1
                    mem.on_rollout_alloc(rid, cached, now, t)
                stalls.on_admit(rid, now, trajectory_id=t)
                ready[t] = math.inf

        # serving first: the oldest queued prefill if its KV fits, else a decode step
        ran_serving = False
        free = mem.total_blocks - serving_blocks() - mem.rollout_used
        if queued and blocks(queued[0].prompt + queued[0].out) <= free:
            r = queued.pop(0)
            now += SERVING.prefill(r.prompt)
            r.generated, r.last = 1, now
            for a in active:
                a.gap_prefill = True
            active.append(r)
            ran_serving = True
        elif active:
            now += SERVING.decode_step(len(active))
            for a in active:
                if a.gap_rollout and not a.gap_prefill:
                    assert now - a.last <= SLO.tpot_s + 1e-9
                    tpot_checked += 1
                a.generated, a.last, a.gap_rollout, a.gap_prefill = a.generated + 1, now, False, False
            active = [a for a in active if a.generated < a.out]
            ran_serving = True
        for action in mem.observe_serving(serving_blocks(), now):
            if action.kind == "abort":
                assert action.reroutable
                reroute(action.request_id, "cut")
        budgets.append((now, mem.budget, mem.state))

        # then at most one rollout step, if admitted
        ran_rollout = False
        pre = [r for r in running.values() if r.todo > 0]
        dec = [r for r in running.values() if r.todo == 0]
        if pre or dec:
            if pre:
                c = min(pre[0].todo, ROLLOUT.chunk_size)
                cost = rollout_step_cost("prefill_chunk", c, ROLLOUT)
                need = blocks(pre[0].kv + c) - blocks(pre[0].kv)
            else:
                cost = rollout_step_cost("decode", len(dec), ROLLOUT)
                need = sum(blocks(r.kv + 1) - blocks(r.kv) for r in dec)
            q = [ServingPrefill(r.arrival, r.prompt) for r in queued]
            d = [ServingDecode(r.last) for r in active]
            decision = adm.admit(cost, q, d, now, kv_ok=mem.can_allocate(need))
            if decision.admitted:
                assert cost <= decision.slack
                for r in queued:  # the slack, recomputed from raw times, covers each request
                    assert (now - r.arrival) + SERVING.prefill(r.prompt) + cost <= SLO.ttft_s + 1e-9
                for r in active:
                    assert (now - r.last) + SERVING.decode_step(len(active)) + cost <= SLO.tpot_s + 1e-9
                admitted.append((now, cost, decision.slack))
                for r in (pre[:1] if pre else dec):
                    mem.on_rollout_alloc(r.rid, blocks(r.kv + (c if pre else 1)) - blocks(r.kv), now, r.traj)
                assert mem.total_blocks - serving_blocks() - mem.rollout_used >= mem.reserve_blocks
                assert mem.rollout_used <= mem.budget
                now += cost
                for a in active:
                    a.gap_rollout = True
                for r in (pre[:1] if pre else dec):
                    stalls.on_progress(r.rid, now)
                    if pre:
                        r.todo, r.kv = r.todo - c, r.kv + c
                    else:
                        r.kv, r.generated = r.kv + 1, r.generated + 1
                        if r.generated >= r.out:  # turn done: keep its prefix under a lease
                            del running[r.rid]
                            mem.on_rollout_free(r.rid)
                            stalls.on_finish(r.rid)
                            ctx[r.traj] = r.kv if r.kv < 2000 else 600  # long: a new trajectory
                            if ctx[r.traj] == r.kv:
                                mem.touch_prefix(r.traj, r.kv // BLOCK, now)  # full blocks only
                            # the environment step; t9's is slow and outlives its lease
                            ready[r.traj] = now + (6.0 if r.traj == "t9" else 0.5)
                ran_rollout = True
            else:
                refused.append((now, decision.reason))
        if not ran_serving and not ran_rollout:
            now = min(pending[0].arrival if pending else END, now + 0.005)

    # the run exercised every path it is meant to check
    reasons = {why for _, why in refused}
    assert len(admitted) > 100 and tpot_checked > 100
    assert {"ttft_slack", "tpot_slack"} & reasons and "kv_headroom" in reasons
    assert {"cut", "stall"} <= {why for _, why in rerouted} and hits > 0 and expired > 0
    cut_at = next(t for t, _, s in budgets if s is not MemoryState.NORMAL)
    assert BURST[0] <= cut_at < BURST[1] + 2.0
    # frozen: the budget never grows between the cut and the next RL step ...
    window = [b for t, b, _ in budgets if cut_at <= t < NEXT_STEP]
    assert all(later <= earlier for earlier, later in zip(window, window[1:]))
    assert window[-1] <= window[0] and window[0] < budgets[0][1]
    # ... which resets it to NORMAL with a budget from the recent peak
    after = [(b, s) for t, b, s in budgets if t >= NEXT_STEP]
    assert after[0][1] is MemoryState.NORMAL and after[0][0] > window[-1]
