"""One simulated RL run on a cluster: the real TurnRouter places every turn, devices run them.

Per RL step: a batch of trajectories (sim/workload.py) is queued; each ready turn is routed by
`TurnRouter.route` (affinity, least-loaded rollout GPU, least-loaded admitting serving GPU, else
queued), reported with `on_turn_start` / `on_turn_end` / `on_turn_aborted`, and run on its
device; a finished turn comes back after its environment time. When the last trajectory ends,
train and publish take the step model's time; serving traffic goes on meanwhile. A serving GPU
takes turns only while its policy version passes the staleness rule and its cached admission
flag is open (pushed to the router with `set_admitting`, as the scheduler's admission view does).
"""
from __future__ import annotations

import gc
import math
import random
import time
from collections import deque

from executors.policies.kv_memory import KVMemoryPolicy
from executors.policies.prediction_margin import nearest_rank
from executors.policies.router import TurnRouter, WorkerInfo
from executors.policies.slo_admission import DualSLOAdmission, SLOConfig
from executors.policies.stall import StallDetector
from executors.policies.tail_handback import TailHandback
from sim.config import SimConfig
from sim.device import Device, Turn
from sim.engine_cost import ContextCost
from sim.events import EventLoop
from sim.elastic import ElasticSide
from sim.handback import HandbackSide
from sim.redundant_sampling import RedundantSampling
from sim.profiles import PROFILE_DIR, load_profile, scaled
from sim.report import summarize
from sim.staleness import policy_floor
from sim.tail_batching import TailBatching
from sim.workload import StepModel, WorkloadSpec, p90, serving_arrivals

MAX_STEP_S = 7200.0  # the horizon per step: a step not done by then is reported unfinished
DEFAULT_STEP_MODEL = StepModel(1.0633637e-4, 1.2176131,
                               "median over 24 fixed-rollout steps of bench/results/learning_fidelity.json")


class ClusterSim(HandbackSide, RedundantSampling, TailBatching, ElasticSide):
    def __init__(self, cfg: SimConfig, workload: WorkloadSpec | None = None,
                 step_model: StepModel = DEFAULT_STEP_MODEL, router: TurnRouter | None = None) -> None:
        self.cfg, self.loop = cfg, EventLoop()
        self.workload = workload or WorkloadSpec.load(PROFILE_DIR / f"{cfg.workload}.json")
        self.step_model = step_model
        if cfg.train_s_per_token is not None:
            self.step_model = StepModel(cfg.train_s_per_token, cfg.publish_s, "SimConfig")
        self.rng = random.Random(cfg.seed)
        self.router = router or TurnRouter(cfg.cap_per_rollout_gpu, cfg.mode)
        self.rollout_prof = scaled(load_profile(cfg.rollout_profile), cfg.engine_scale)
        self.serving_prof = scaled(load_profile(cfg.serving_profile), cfg.engine_scale)
        self.slo = SLOConfig.from_profile(self.serving_prof)  # the serving worker's own rule
        if cfg.slo_ttft_s is not None and cfg.slo_tpot_s is not None:
            self.slo = SLOConfig(cfg.slo_ttft_s, cfg.slo_tpot_s)
        self.devices: dict[str, Device] = {}
        self.serving_devices: list[Device] = []
        self.queue: deque[str] = deque()
        self.trajs: dict[str, list] = {}  # tid -> [trajectory, turn index, context tokens, group]
        self.flags: dict[str, bool] = {}
        self.closed_until: dict[str, float] = {}
        self.version: dict[str, int] = {}
        self.counts = dict(started=0, finished=0, turns=0, rerouted=0, affine=0, later_turns=0,
                           tokens=0, borrowed_tokens=0, cached=0, prompt=0, handed_back=0, dropped=0,
                           turn_s_dedicated=0.0, out_dedicated=0, turn_s_borrowed=0.0, out_borrowed=0)
        self.steps: list[dict] = []
        self._step_started, self._step_tokens, self._left = 0.0, 0, 0
        self._train_tokens = 0  # what the step's trainer is charged for (SimConfig.train_tokens)
        self._trainer_free, self._published_at = 0.0, {0: 0.0}  # the trainer's and publishes' timeline
        self.handback = TailHandback()
        self._sent: dict[str, tuple[str, float]] = {}  # tid -> (device, sent at) of turns out now
        # turns out on co-serving GPUs, oldest first (the loop's clock never goes back):
        # tid -> (sent at, (tid, turn index)); and turns out on dedicated rollout GPUs
        self._borrowed: dict[str, tuple[float, tuple[str, int]]] = {}
        self._dedicated_out = 0
        self._dropped: set[str] = set()  # DAPO: trajectories dropped once their step had its groups
        self._handback_at = math.inf  # the pending hand-back check, if any
        self._build()

    # ---- fleet ------------------------------------------------------------------------------
    def _build(self) -> None:
        c = self.cfg
        ctx = ContextCost(c.rollout_kv_s_per_token, c.rollout_attn_s_per_pair)
        for i in range(c.rollout_gpus):
            self._add(Device(self.loop, f"rollout-{i}", "rollout", self.rollout_prof, self._done, self._abort,
                             context=ctx, kv_pool=c.rollout_kv_blocks, jump=c.event_jump))
        arrival_len = p90([r.prompt for r in _sample_prompts(c)])
        for j in range(c.serving_gpus):
            arrivals = serving_arrivals(c.serving_rate, self.rng.uniform(0, 3600), c.serving_length_scale,
                                        max_model_len=c.serving_max_len)
            name = f"serving-{j}"
            if c.config in ("fixed", "elastic"):
                dev = Device(self.loop, name, "serving", None, self._done, self._abort,
                             serving=self.serving_prof, arrivals=arrivals, jump=c.event_jump)
            elif c.config == "static":  # half the device each: two half-speed engines side by side
                dev = Device(self.loop, name, "serving", None, self._done, self._abort,
                             serving=scaled(self.serving_prof, 2.0), arrivals=arrivals, jump=c.event_jump)
                half = Device(self.loop, f"{name}-r", "rollout", scaled(self.rollout_prof, 2.0),
                              self._done, self._abort,
                              context=ContextCost(2 * ctx.kv_s_per_token, 2 * ctx.attn_s_per_pair),
                              kv_pool=c.kv_blocks // 2, jump=c.event_jump)
                half.borrowed = True
                self._add(half)
            else:
                admission = DualSLOAdmission(self.serving_prof, self.slo, "mixed", "monolithic",
                                             arrival_prompt_len=arrival_len, next_step_prefills=True)
                dev = Device(self.loop, name, "serving", self.rollout_prof, self._done, self._abort,
                             serving=self.serving_prof, admission=admission,
                             memory=KVMemoryPolicy(c.kv_blocks), stall=StallDetector(2.0),
                             arrivals=arrivals, slo_aware=c.config == "rose", on_iter=self._on_iter,
                             context=ctx, jump=c.event_jump)
                self.router.register_worker(WorkerInfo(name, "serving"))
                self.router.set_admitting(name, False)
                self.flags[name], self.version[name] = False, 0
                self.devices[name] = dev
            self.serving_devices.append(dev)
        self._build_elastic(ctx)

    def _add(self, dev: Device) -> None:
        self.devices[dev.name] = dev
        self.router.register_worker(WorkerInfo(dev.name, "rollout"))

    # ---- run --------------------------------------------------------------------------------
    def run(self) -> dict:
        wall = time.perf_counter()
        self.loop.at(0.0, self._start_step, 1)
        # serving arrivals never run out: a lost trajectory would stall the step forever, so a
        # generous horizon ends the run and the report shows it in flight
        # the cyclic collector off while it runs: the loop makes no cycles worth collecting, and
        # at 1,024 GPUs x 50 steps its full passes over millions of live objects cost ~15% CPU
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.loop.run(t_max=MAX_STEP_S * self.cfg.steps)  # _end_rollout stops it after the last step
        finally:
            if collecting:
                gc.enable()
        for dev in {id(d): d for d in [*self.devices.values(), *self.serving_devices]}.values():
            dev._interrupt()  # a jump in progress: the steps begun by now happened
        return summarize(self, time.perf_counter() - wall)

    def _start_step(self, step: int) -> None:
        now = self.loop.now
        self._step, self._step_started, self._step_tokens, self._train_tokens = step, now, 0, 0
        self._traj_s: list[float] = []  # this step's trajectory times, launch to last turn
        self._borrowed0 = self.counts["borrowed_tokens"]
        # a serving GPU's turns lag the trainer at most max_staleness in all, and at least the
        # pipeline's own lag (flows/rl_step.serving_lag_cfg)
        floor = policy_floor(step, max(self.cfg.max_staleness, self.cfg.off_policy), "serving")
        for name, dev in self.devices.items():
            dev.start_step(now)
            if name in self.version:
                dev.eligible = self.version[name] >= floor
                self._on_iter(dev)
        self._allocate_elastic(now)  # "elastic": external GPUs join after their allocation
        self._launch_step(step)  # the batch, or DAPO's groups (sim/redundant_sampling.py)
        self._dispatch()

    def _end_rollout(self, _=None) -> None:
        """Train and publish the step. Synchronous: the next step starts once it is published.
        One-step off-policy: train s waits for train s-1, publish s for publish s-1, and the
        next rollout starts now if version s-1 is published (else when it is)."""
        now, sm, step = self.loop.now, self.step_model, self._step
        rollout_s = now - self._step_started
        self._release_elastic()
        train_s = sm.train_s(self._train_tokens, self.cfg.train_gpus)
        self._trainer_free = max(now, self._trainer_free) + train_s
        published = max(self._trainer_free, self._published_at.get(step - 1, 0.0)) + sm.publish_s
        self._published_at[step] = published
        self.steps.append(dict(step=step, rollout_s=rollout_s, train_s=train_s, publish_s=sm.publish_s,
                               step_s=published - self._step_started, end_s=published,
                               tokens=self._step_tokens, train_tokens=self._train_tokens,
                               trajectory_s=_quantiles(self._traj_s),
                               borrowed_tokens=self.counts["borrowed_tokens"] - self._borrowed0))
        for name in self.version:  # serving GPUs pull the new version in the background
            self.loop.at(published + self.cfg.pull_s, self._pulled, (name, step))
        if len(self.steps) >= self.cfg.steps:
            self.loop.stop()
        else:
            start = published if not self.cfg.off_policy else \
                max(now, self._published_at.get(step - 1, 0.0))
            self.loop.at(start, self._start_step, step + 1)

    def _pulled(self, arg: tuple[str, int]) -> None:
        name, version = arg
        self.version[name] = max(self.version[name], version)
        dev = self.devices[name]
        dev.eligible = self.version[name] >= policy_floor(self._step, self.cfg.max_staleness, "serving")
        self._on_iter(dev)

    # ---- routing ----------------------------------------------------------------------------
    def _admits(self, name: str) -> bool:
        return self.flags.get(name, False) and self.router.load(name) < self.cfg.serving_max_turns

    def _dispatch(self) -> None:
        q, route = self.queue, self.router.route
        if self.cfg.mode == "pinned":  # a pinned trajectory waits for its home; others may go
            for _ in range(len(q)):
                tid = q.popleft()
                name = route(tid, self._admits)
                q.append(tid) if name is None else self._place(tid, name)
            return
        while q:
            name = route(q[0], self._admits)
            if name is None:
                return
            self._place(q.popleft(), name)

    def _place(self, tid: str, name: str) -> None:
        traj, k, context, _ = self.trajs[tid]
        self._turn_out(tid, name, k)
        placement = self.router.on_turn_start(tid, name)
        turn = Turn(tid, context, traj.responses[k], placed_at=self.loop.now)
        if placement.affine and k > 0:
            turn.cached = context - traj.obs[k - 1]  # the previous turn's prompt + response
        self.devices[name].submit(turn, placement.affine and k > 0)

    def _done(self, dev: Device, turn: Turn) -> None:
        self.router.on_turn_end(turn.tid, dev.name)
        sent = self._turn_left(dev, turn.tid)
        if sent is not None:  # a dedicated GPU's turn: its time sets the hand-back's pace
            self.handback.on_dedicated_turn(self.loop.now - sent)
        c, tokens = self.counts, turn.context + turn.response
        c["turns"] += 1
        c["tokens"] += tokens
        c["cached"] += turn.cached
        c["prompt"] += turn.context
        self._step_tokens += tokens
        kind = "borrowed" if dev.borrowed else "dedicated"
        c[f"turn_s_{kind}"] += self.loop.now - turn.placed_at
        c[f"out_{kind}"] += turn.response
        if dev.borrowed:
            c["borrowed_tokens"] += tokens
        state = self.trajs[turn.tid]
        traj, k = state[0], state[1]
        if self.cfg.train_tokens == "every_turn" or k + 1 == traj.turns:  # else: the final sequence only
            self._train_tokens += tokens
        if k + 1 < traj.turns:
            state[1], state[2] = k + 1, turn.context + turn.response + traj.obs[k]
            self.loop.at(self.loop.now + traj.env_s[k] + traj.dispatch_s[k], self._ready, turn.tid)
        else:
            self._finish(turn.tid)
        self._dispatch()
        self._hand_back_tail()

    def _ready(self, tid: str) -> None:
        if tid in self._dropped:
            self._forget_dropped(tid)
            return
        self.queue.append(tid)
        self._dispatch()

    def _finish(self, tid: str) -> None:
        for p in self.router.forget(tid):
            if p.turn > 0 and not p.rerouted:
                self.counts["later_turns"] += 1
                self.counts["affine"] += p.affine
        group = self.trajs.pop(tid)[3]
        self._traj_s.append(self.loop.now - self._step_started)
        self.counts["finished"] += 1
        if self._rollout_done_with(tid, group):  # the rollout task ends after its own overhead
            self.loop.at(self.loop.now + self.workload.rollout_overhead_s, self._end_rollout)

    def _abort(self, dev: Device, turn: Turn) -> None:
        """A KV cut or stall gave the turn back: reroute it; close the worker's gate for a poll."""
        self.router.on_turn_aborted(turn.tid, dev.name)
        self._turn_left(dev, turn.tid)
        if turn.tid in self._dropped:  # DAPO has its groups: forgotten, not rerouted
            self._forget_dropped(turn.tid)
            return
        self.counts["rerouted"] += 1
        self.closed_until[dev.name] = self.loop.now + self.cfg.admission_refresh_s
        self.loop.at(self.closed_until[dev.name], lambda d: self._on_iter(d), dev)
        self._set_flag(dev.name, False)
        self.queue.appendleft(turn.tid)
        self._dispatch()

    def _on_iter(self, dev: Device) -> None:
        if dev.name not in self.flags:
            return
        flag = dev.admitting() and self.loop.now >= self.closed_until.get(dev.name, 0.0)
        if flag != self.flags[dev.name]:
            self._set_flag(dev.name, flag)
            if flag and self.queue:
                self._dispatch()

    def _set_flag(self, name: str, flag: bool) -> None:
        self.flags[name] = flag
        self.router.set_admitting(name, flag)


def _quantiles(xs: list[float]) -> dict:
    """P50 / P75 / P90 / max of a step's trajectory times."""
    s = sorted(xs)
    return {f"p{q}": nearest_rank(s, q / 100) for q in (50, 75, 90)} | {"max": s[-1]} if s else {}


def _sample_prompts(c: SimConfig):
    """The first 2,000 serving requests: their P90 prompt is the arrival length admission guards."""
    gen = serving_arrivals(c.serving_rate, 0.0, c.serving_length_scale, max_model_len=c.serving_max_len)
    return [next(gen) for _ in range(2000)]
