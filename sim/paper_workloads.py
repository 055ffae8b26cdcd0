"""The ROSE paper's workloads as simulator workload files (sim/profiles/workload_paper_*.json).

The paper publishes a few statistics of its runs, not their distributions, so each workload is a
small parametric model: log-normal distributions (median, sigma) written as the 21 quantiles
WorkloadSpec reads. Every parameter carries its source in the file's "citations": a sentence of
the ROSE paper ("ROSE: Rollout On Serving GPUs via Cooperative Elasticity for Agentic RL", the
section named), or "chosen" with the reason where the paper gives no number. Two parameters are
fitted, each to one published number, by `python -m bench.sim.paper_figures --fit`, which rewrites
the file (the response median to the prefill-token share, the turn median to the 8-GPU rollout
time); the other published statistics are then predictions the figures check. The file keeps
the parameters it was written from ("paper_params"): `PaperWorkload.load` reads them back.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import NormalDist

from sim.config import SimConfig
from sim.fleet import sweep_settings
from sim.profiles import PROFILE_DIR
from sim.workload import QUANTILES, WorkloadSpec

TAIL = 0.001  # the 0th / 100th quantile written as this / 1 - this (a log-normal has no ends)


@dataclass(frozen=True)
class PaperWorkload:
    name: str
    turns_median: float
    response_median: float  # tokens of one turn's response (thinking + action)
    response_sigma: float = 0.8  # spread of a turn's response around its trajectory's level
    trajectory_sigma: float = 1.6  # spread of trajectories' response level (the long tail)
    # a second mode of trajectory levels: this share of trajectories `long_level` times the others'
    # level (each mode log-normal with trajectory_sigma); 0: one mode
    long_share: float = 0.0
    long_level: float = 1.0
    turns_sigma: float = 0.5
    max_turns: int = 20
    first_prompt: float = 600.0
    obs_tokens: float = 120.0
    env_s: float = 0.2
    max_context: int = 32768
    success_rate: float = 0.5

    def __post_init__(self) -> None:
        if min(self.turns_median, self.response_median, self.first_prompt, self.obs_tokens) <= 0:
            raise ValueError("medians must be > 0")
        if min(self.response_sigma, self.trajectory_sigma, self.turns_sigma) < 0 or self.env_s < 0:
            raise ValueError("sigmas and env_s must be >= 0")
        if not 0 <= self.long_share < 1 or self.long_level < 1:
            raise ValueError(f"long_share must be in [0, 1) and long_level >= 1, got {self.long_share}, "
                             f"{self.long_level}")
        if self.max_turns < 1 or self.max_context < 2:
            raise ValueError("max_turns must be >= 1 and max_context >= 2")

    def spec(self) -> WorkloadSpec:
        q = {"turns": _lognormal(self.turns_median, self.turns_sigma, 1, self.max_turns),
             "first_prompt": _lognormal(self.first_prompt, 0.1, 1, self.max_context),
             "obs_tokens": _lognormal(self.obs_tokens, 0.1, 1, self.max_context),
             "response": _lognormal(self.response_median, self.response_sigma, 1, self.max_context),
             "response_scale": _two_mode(self.trajectory_sigma, self.long_share, self.long_level),
             "env_s": _lognormal(self.env_s, 0.5, 0.0, math.inf) if self.env_s else [0.0] * len(QUANTILES),
             "dispatch_s": [0.0] * len(QUANTILES)}
        return WorkloadSpec(q, self.success_rate, f"paper workload {self.name}: {asdict(self)}", 0.0,
                            self.max_context, CITATIONS_32B if self.name == QWEN3_32B_ALFWORLD.name else CITATIONS)

    def write(self, directory: Path = PROFILE_DIR) -> Path:
        """The workload file, with these parameters beside the quantiles (`load` reads them back)."""
        path = directory / f"workload_paper_{self.name}.json"
        doc = json.loads(self.spec().to_json()) | {"paper_params": asdict(self)}
        path.write_text(json.dumps(doc, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, name: str, directory: Path = PROFILE_DIR) -> "PaperWorkload":
        """The parameters a shipped (fitted) workload file was written from."""
        path = directory / f"workload_paper_{name}.json"
        if not path.is_file():
            raise FileNotFoundError(f"no paper workload {name!r} in {directory}")
        return cls(**json.loads(path.read_text())["paper_params"])


CITATIONS = {
    "max_context": "ROSE paper §6: 'We use Qwen3-8B/32k for FrozenLake ... and Qwen3-32B/32k for ALFWorld'; §2: "
                   "'configured with a maximum response length of 32k tokens'",
    "batch": "ROSE paper §6: 'we set the group size to 16 and use batch sizes of 256 and 1024 for Qwen3-8B and "
             "Qwen3-32B' (trajectories per step: the SimConfig, 32 per rollout GPU at 8 rollout GPUs)",
    "response": "fitted: the median so that prefill tokens are 'accounted for 77% (Qwen3-8B) and 86% "
                "(Qwen3-32B) of total tokens' (ROSE paper §2)",
    "turns": "fitted: the median so that rollout at 8 GPUs takes 607 s ('the rollout time reduces from 607 s "
             "to 435 s', ROSE paper §2, Fig. 1c); sigma 0.5 and at most 20 turns chosen (not published)",
    "response_scale": "chosen (not published): one log-normal level per trajectory, so whole trajectories "
                      "are long-tailed ('most trajectories finish quickly, while a small fraction take much "
                      "longer', §2); sigma 1.6 because at 0.8 or 1.2 the P75 trajectory took 46-64% of the "
                      "rollout against the paper's 'at most 30%' (so that check is not independent); "
                      "bench/paper_figures.py's sensitivity table varies it, and its Fig. 1b table tries two "
                      "modes instead (sim/paper_figures.py TAIL_SHAPES)",
    "response_sigma": "chosen (not published): a turn's spread around its trajectory's level, sigma 0.8",
    "first_prompt": "chosen (not published): 600 tokens, a FrozenLake system prompt with rules and the grid",
    "obs_tokens": "chosen (not published): 120 tokens, the grid rendered again and the move's feedback",
    "env_s": "chosen (not published): median 0.2 s per environment step (a toy-text environment behind an "
             "environment manager)",
}

CITATIONS_32B = {
    "max_context": CITATIONS["max_context"],
    "batch": "ROSE paper §6: 'we set the group size to 16 and use batch sizes of 256 and 1024 for Qwen3-8B and "
             "Qwen3-32B' (1,024 trajectories per step: 256 per TP-4 rollout engine at 4 engines = 16 GPUs)",
    "response": "fitted: the median so that prefill tokens are 'accounted for ... 86% (Qwen3-32B) of total "
                "tokens' (ROSE paper §2)",
    "turns": "fitted: the median so that ROSE's rollout takes 960.1 s (ROSE paper §6.2 Table 1 and App. D "
             "Table 5, 'Qwen3-32B ... ROSE ... 960.1', at the §6 setting); sigma 0.5 chosen (not published); at "
             "most 50 turns chosen: ALFWorld's customary 50-step episode limit (the paper gives none)",
    "response_scale": "chosen (not published), as for Qwen3-8B: one log-normal level per trajectory, sigma 1.6 "
                      "('most trajectories finish quickly, while a small fraction take much longer', §2)",
    "response_sigma": "chosen (not published): a turn's spread around its trajectory's level, sigma 0.8",
    "first_prompt": "chosen (not published): 1,200 tokens, ALFWorld's instructions, the task and the room's first "
                    "description with its admissible commands",
    "obs_tokens": "chosen (not published): 250 tokens, the step's observation and the admissible commands again",
    "env_s": "chosen (not published): median 0.5 s per environment step (a TextWorld game in a CPU container "
             "reached through Kubernetes API calls, ROSE paper §5)",
}

# the starting points of the fits: their two fitted medians are only first guesses
QWEN3_8B_FROZENLAKE = PaperWorkload("qwen3_8b_frozenlake", turns_median=5.0, response_median=300.0)
QWEN3_32B_ALFWORLD = PaperWorkload("qwen3_32b_alfworld", turns_median=10.0, response_median=300.0, max_turns=50,
                                   first_prompt=1200.0, obs_tokens=250.0, env_s=0.5)


# What the paper's trainer is charged for (SimConfig.train_tokens); the paper never says how a
# multi-turn trajectory becomes training samples, and everything it says reads as one sequence
# per trajectory: 'The resulting sequence of actions and feedback forms a trajectory. In the
# training stage, the agent LLM updates its weights on the collected trajectories' (§1), 'the
# generated trajectories are fed into the training stage' (§3), and it trains 32B with context
# parallelism ('(TP, PP, CP) is ... (8, 1, 2)', §6), which splits one long sequence over GPUs.
# So each finished trajectory's final sequence, once (not each turn's whole context again).
PAPER_TRAIN_TOKENS = "final_sequence"
QWEN3_32B_FLEET = "h100_qwen3_32b"  # TP-4 engines (sim/profiles/fleet_h100_qwen3_32b.json)
QWEN3_32B_TP = 4  # §6: 'Rollout TP is 1 (8B) and 4 (32B)'


def qwen3_32b_setting(**kw) -> SimConfig:
    """The paper's 32B setting (§6), one simulated device per TP-4 engine: (Rollout, Training) =
    (16, 32) GPUs, so 4 rollout engines and 32 trainers; 1,024 trajectories a step (256 per
    engine); 'the per-device rollout batch size' 16 read per GPU, 64 per engine (on serving
    engines too); borrowed serving GPUs capped at 64, 16 engines; the trainer charged for each
    trajectory's final sequence (PAPER_TRAIN_TOKENS). `kw` changes any field."""
    engines = 16 // QWEN3_32B_TP
    base = dict(gpus=engines + 32, trainers=32, traj_per_rollout_gpu=1024 // engines,
                cap_per_rollout_gpu=16 * QWEN3_32B_TP, serving_max_turns=16 * QWEN3_32B_TP,
                serving_ratio=64 / QWEN3_32B_TP / engines, workload=f"workload_paper_{QWEN3_32B_ALFWORLD.name}",
                train_tokens=PAPER_TRAIN_TOKENS)
    return SimConfig(**(base | sweep_settings(QWEN3_32B_FLEET, None) | kw))


def _lognormal(median: float, sigma: float, low: float, high: float) -> list[float]:
    """The 21 quantiles of a log-normal (median, sigma) clipped to [low, high]."""
    nd = NormalDist()
    out = []
    for p in QUANTILES:
        p = min(max(p, TAIL), 1 - TAIL)
        out.append(min(high, max(low, median * math.exp(sigma * nd.inv_cdf(p)))))
    return out


def _two_mode(sigma: float, long_share: float, long_level: float) -> list[float]:
    """The 21 quantiles of a trajectory's response level: log-normal (median 1, sigma), or, with
    long_share > 0, a mixture of it and the same at median long_level (bisection on the CDF)."""
    if long_share == 0:
        return _lognormal(1.0, sigma, 0.0, math.inf)
    if sigma == 0:  # two point masses
        return [1.0 if p <= 1 - long_share else long_level for p in QUANTILES]
    nd = NormalDist()

    def cdf(x: float) -> float:
        return ((1 - long_share) * nd.cdf(math.log(x) / sigma)
                + long_share * nd.cdf(math.log(x / long_level) / sigma))

    out, low, high = [], math.exp(-8 * sigma), long_level * math.exp(8 * sigma)
    for p in QUANTILES:
        p = min(max(p, TAIL), 1 - TAIL)
        lo, hi = low, high
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
        out.append(math.sqrt(lo * hi))
    return out


def prefill_share(spec: WorkloadSpec, n: int = 4000, seed: int = 0) -> float:
    """Prompt tokens (every turn's whole context) over all tokens, over `n` sampled trajectories."""
    rng, prompt, total = random.Random(seed), 0, 0
    for _ in range(n):
        t = spec.sample(rng)
        context = t.first_prompt
        for k, r in enumerate(t.responses):
            prompt += context
            total += context + r
            if k + 1 < t.turns:
                context += r + t.obs[k]
    return prompt / total


def turn_tokens_per_sequence_token(spec: WorkloadSpec, n: int = 4000, seed: int = 0) -> float:
    """Tokens summed over turns (each turn's whole context and response, what a step's throughput
    and the simulator's train time count) over the tokens of the trajectories' final sequences."""
    rng, per_turn, final = random.Random(seed), 0, 0
    for _ in range(n):
        t = spec.sample(rng)
        context = t.first_prompt
        for k, r in enumerate(t.responses):
            per_turn += context + r
            if k + 1 < t.turns:
                context += r + t.obs[k]
        final += context + t.responses[-1]
    return per_turn / final


def fit_response_median(base: PaperWorkload, share: float, n: int = 1500) -> PaperWorkload:
    """The response median at which prompt tokens are `share` of all tokens (bisection: the
    share falls as responses grow)."""
    if not 0 < share < 1:
        raise ValueError(f"prefill share must be in (0, 1), got {share}")
    lo, hi = 1.0, float(base.max_context)
    for _ in range(16):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if prefill_share(replace(base, response_median=mid).spec(), n) > share else (lo, mid)
    return replace(base, response_median=round((lo * hi) ** 0.5, 1))


def fit_turns_median(base: PaperWorkload, share: float, rollout_s: float, rollout_of, lo: float = 1.0,
                     hi: float = 12.0, rounds: int = 7) -> PaperWorkload:
    """The turn median (with the response median refitted to `share` at each) at which
    `rollout_of(spec)` (simulated rollout seconds) is `rollout_s`; bisection, as rollout time
    grows with turns at a fixed share."""
    for _ in range(rounds):
        mid = (lo + hi) / 2
        w = fit_response_median(replace(base, turns_median=mid), share)
        lo, hi = (mid, hi) if rollout_of(w.spec()) < rollout_s else (lo, mid)
    return fit_response_median(replace(base, turns_median=round((lo + hi) / 2, 2)), share)

