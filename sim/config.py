"""What one simulation runs: the fleet, the configuration, the workload knobs."""
from __future__ import annotations

from dataclasses import dataclass

from core.modes import ROUTING_MODES

CONFIGS = ("fixed", "rose", "slo_unaware", "static", "elastic")
ALGORITHMS = ("grpo", "dapo")
TRAIN_TOKENS = ("every_turn", "final_sequence")


@dataclass(frozen=True)
class SimConfig:
    """gpus: the RL job's own GPUs, half trainers and half dedicated rollout GPUs (our split).
    serving_ratio: borrowed serving GPUs per rollout GPU (the issue's 1x-4x).
    config: "fixed" (serving GPUs only serve), "rose" (co-serving with admission, memory policy,
    stall rule), "slo_unaware" (co-serving, every rollout step admitted), "static" (each serving
    GPU split 50/50: serving and rollout engines each at half speed, no admission), "elastic"
    (serving GPUs only serve; as many external GPUs join rollout each step, elastic_alloc_s after
    it starts: sim/elastic.py).
    """

    gpus: int = 16
    config: str = "rose"
    mode: str = "turnwise_affinity"
    serving_ratio: float = 1.0
    steps: int = 3
    seed: int = 0
    traj_per_rollout_gpu: int = 32  # batch = this x rollout GPUs (our choice; 2x the router cap)
    serving_rate: float = 12.0  # trace speed-up per serving GPU (the load level)
    kv_blocks: int = 2048  # KV pool per device, blocks of 32 tokens
    cap_per_rollout_gpu: int = 16  # router cap (rollout.max_concurrency_per_worker default)
    serving_max_turns: int = 16  # rollout turns per serving GPU (rollout.serving_max_turns_per_worker default)
    max_staleness: int = 0  # versions a serving GPU may lag (rollout.serving_lag, 1 in a run)
    # RunConfig.max_staleness: 1 = one-step off-policy, step s+1's rollout overlaps step s's
    # train and publish (flows/pipeline.py's gates); 0 = synchronous steps
    off_policy: int = 0
    pull_s: float = 0.0  # serving GPUs' background pull of a new version (0: no model given)
    admission_refresh_s: float = 0.3  # a serving GPU that aborted a turn stays closed this long
    tail_handback: bool = True  # executors/policies/tail_handback.py (rollout.handback_factor)
    slo_ttft_s: float | None = None  # None: SLOConfig.from_profile (the serving worker's own rule)
    slo_tpot_s: float | None = None
    rollout_profile: str = "cpu_policy"
    # every engine latency times this: the profiles were measured on a quiet machine; a run
    # recorded under other load is matched by calibrating this one factor (bench/cluster_sim.py)
    engine_scale: float = 1.0
    serving_profile: str = "cpu_serving"
    workload: str = "workload_frozenlake"  # sim/profiles/<name>.json (sim/workload.py WorkloadSpec)
    # serving requests' lengths: the CPU models replay the trace's prompts x1/16 under a
    # 2,048-token context (as the demo does); a GPU fleet (sim/fleet.py) replays them whole
    serving_length_scale: float = 1 / 16
    serving_max_len: int = 2048
    # the RL step's train and publish model; None: fitted from the local stack's measured steps
    train_s_per_token: float | None = None
    publish_s: float | None = None
    # what the trainer is charged for: "every_turn", each turn a sample of its whole context and
    # response (the product's trainer: tasks/train.py trains the step's turns, and the default
    # step model was fitted per such token); "final_sequence", each finished trajectory once as
    # its last turn's context + response (one sequence of actions and feedback, the paper's
    # reading: sim.paper_workloads.PAPER_TRAIN_TOKENS). Throughput counts every turn's tokens either way.
    train_tokens: str = "every_turn"
    # what long contexts add to rollout steps (sim/engine_cost.py; a fleet derives them, 0: none)
    rollout_kv_s_per_token: float = 0.0
    rollout_attn_s_per_pair: float = 0.0
    # a dedicated rollout GPU's KV pool in blocks (None: unbounded); co-serving GPUs share kv_blocks
    rollout_kv_blocks: int | None = None
    # what a step launches (sim/redundant_sampling.py): GRPO's batch, or DAPO's groups until
    # batch / group_size of them are valid, each valid with dapo_valid_rate (not published)
    algorithm: str = "grpo"
    group_size: int = 16
    dapo_valid_rate: float = 0.5
    # trainer GPUs (None: half the job's GPUs); the paper's (rollout, train) splits are (8, 8), (16, 32)
    trainers: int | None = None
    elastic_alloc_s: float = 60.0  # "elastic": seconds from a step's start until external GPUs serve rollout
    # RollPacker's tail batching (sim/tail_batching.py): trajectories in the top tail_share of
    # response tokens are deferred from short rounds to a long round of their own
    tail_batching: bool = False
    tail_share: float = 0.25
    # silent decode runs as one event (sim/decode_jump.py); False: one event per engine iteration
    event_jump: bool = True

    def __post_init__(self) -> None:
        if self.config not in CONFIGS:
            raise ValueError(f"config must be one of {CONFIGS}, got {self.config!r}")
        if self.mode not in ROUTING_MODES:
            raise ValueError(f"mode must be one of {ROUTING_MODES}, got {self.mode!r}")
        if self.gpus < 2 or self.steps < 1 or self.traj_per_rollout_gpu < 1:
            raise ValueError("need gpus >= 2, steps >= 1, traj_per_rollout_gpu >= 1")
        if self.off_policy not in (0, 1):
            raise ValueError(f"off_policy must be 0 (synchronous) or 1, got {self.off_policy}")
        if self.engine_scale <= 0:
            raise ValueError(f"engine_scale must be > 0, got {self.engine_scale}")
        if self.serving_ratio < 0 or self.serving_rate <= 0:
            raise ValueError("serving_ratio must be >= 0 and serving_rate > 0")
        if self.serving_length_scale <= 0 or self.serving_max_len < 2:
            raise ValueError("serving_length_scale must be > 0 and serving_max_len >= 2")
        if (self.train_s_per_token is None) != (self.publish_s is None):
            raise ValueError("give both train_s_per_token and publish_s, or neither")
        if self.train_s_per_token is not None and (self.train_s_per_token < 0 or self.publish_s < 0):
            raise ValueError("train_s_per_token and publish_s must be >= 0")
        if self.rollout_kv_s_per_token < 0 or self.rollout_attn_s_per_pair < 0:
            raise ValueError("rollout context cost terms must be >= 0")
        if self.train_tokens not in TRAIN_TOKENS:
            raise ValueError(f"train_tokens must be one of {TRAIN_TOKENS}, got {self.train_tokens!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.group_size < 1 or not 0 < self.dapo_valid_rate <= 1:
            raise ValueError("group_size must be >= 1 and dapo_valid_rate in (0, 1]")
        if self.trainers is not None and not 1 <= self.trainers < self.gpus:
            raise ValueError(f"trainers must be in 1..gpus-1, got {self.trainers}")
        if self.elastic_alloc_s < 0 or not 0 < self.tail_share < 1:
            raise ValueError("elastic_alloc_s must be >= 0 and tail_share in (0, 1)")
        if self.tail_batching and self.algorithm != "grpo":
            raise ValueError("tail batching is modelled for GRPO's fixed batch only")
        if self.rollout_kv_blocks is not None and self.rollout_kv_blocks < 1:
            raise ValueError(f"rollout_kv_blocks must be >= 1 or None, got {self.rollout_kv_blocks}")

    @property
    def train_gpus(self) -> int:
        return self.gpus // 2 if self.trainers is None else self.trainers

    @property
    def rollout_gpus(self) -> int:
        return self.gpus - self.train_gpus

    @property
    def serving_gpus(self) -> int:
        return round(self.rollout_gpus * self.serving_ratio)
