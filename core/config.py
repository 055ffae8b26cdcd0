"""Run configuration: one pydantic model per concern, unknown keys rejected, each knob once.

These models are also the Prefect flow parameters, so the UI renders them as forms
with defaults and validation. The layers below take them as they are (the rollout scheduler
takes RolloutConfig as its SchedulerConfig, a serving worker's executor extends
CoServingSettings) or get plain dataclasses built from them (the policies import no pydantic).
docs/configuration.md: the sections, `rose config show`, and the environment variables.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.modes import Device, RoutingMode, StackServingMode

MB = 1 << 20
BLOCK_SIZE = 32  # tokens per KV block (vLLM CPU attention wants multiples of 32)
DEVICE_CLASS_PATTERN = re.compile(r"[A-Za-z0-9_]+")  # a rollout worker's device class (hw_affinity)


def data_dir() -> Path:
    """Where models, runs and trajectories live (ROSE_DATA_DIR, default ./.rose)."""
    return Path(os.environ.get("ROSE_DATA_DIR", ".rose")).resolve()


def stack_dir() -> Path:
    """The local stack's directory: logs, pids, stack.json, Prefect home, relay files."""
    return data_dir() / "stack"


def vllm_cache_dir(models_root: Path | None = None) -> Path:
    """vLLM's caches beside the models (default <data_dir>/models), so that every stack and engine
    of them reuses them: vLLM inspects a model class in a subprocess that imports vLLM (~10 s of
    a core here) unless cached, and on cuda compiles graphs."""
    return (Path(models_root) if models_root else data_dir() / "models") / ".vllm-cache"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


EnvName = Literal["frozenlake", "guess", "sokoban", "sokoban_easy"]


class ModelsConfig(Strict):
    """Locally built Hugging Face model directories (built by `rose models build`)."""

    policy_dir: Path | None = None  # default: <data_dir>/models/policy
    serving_dir: Path | None = None  # default: <data_dir>/models/serving
    seed: int = 0
    # environments the policy is warmed up on (and its tokenizer trained on); sokoban is opt-in
    # since its long episodes add to every build (rose/models/build.py)
    demo_envs: list[EnvName] = ["frozenlake", "guess"]

    @field_validator("demo_envs")
    @classmethod
    def _some_envs(cls, envs: list[str]) -> list[str]:
        if not envs:
            raise ValueError("name at least one environment to warm the policy up on")
        return sorted(set(envs))

    def policy_path(self) -> Path:
        return Path(self.policy_dir) if self.policy_dir else data_dir() / "models" / "policy"

    def serving_path(self) -> Path:
        return Path(self.serving_dir) if self.serving_dir else data_dir() / "models" / "serving"


def _pem_problem(path: Path) -> str | None:
    """Why `path` cannot serve as a PEM file (missing, unreadable, not PEM), or None."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return f"{path} does not exist"
    except IsADirectoryError:
        return f"{path} is a directory, not a PEM file"
    except PermissionError:
        return f"{path} cannot be read (permission denied)"
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or type(e).__name__})"
    return None if b"-----BEGIN " in text else f"{path} is not a PEM file (no '-----BEGIN' line)"


class DaskTLS(Strict):
    """The files a ROSE client presents to a cluster's Dask scheduler over TLS (mutual: the
    scheduler checks this certificate, this client the scheduler's, both against the CA).
    `rose cluster certs DIR` makes them; docs/cluster.md, "TLS between Dask processes"."""

    ca_file: Path  # the CA that signed the scheduler's, workers' and this client's certificates
    cert_file: Path  # this client's certificate
    key_file: Path  # its private key (unencrypted: distributed takes no passphrase)

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _readable_pem(cls, path: Path) -> Path:
        # absolute: the paths are recorded in stack.json and read by processes in other cwds
        path = path.expanduser().resolve()
        problem = _pem_problem(path)
        if problem:
            raise ValueError(problem)
        return path


class CoServingSettings(Strict):
    """A serving worker's co-serving executor (executors/coserving/): its memory policy and
    rollout admission. The executor's CoServingConfig adds the models, the mode and the SLO."""

    # per-engine KV pool in blocks of BLOCK_SIZE tokens; None: VLLM_CPU_KVCACHE_SPACE (on a GPU
    # vLLM sizes it from the engine's memory fraction, and a count here is refused)
    kv_blocks: int | None = Field(None, ge=1)
    reserve_fraction: float = Field(0.2, gt=0, lt=1)  # of the pool kept back for serving bursts
    high_watermark: float = Field(0.5, ge=0, le=1)  # burst trigger: share of the reserve serving may eat
    cut_factor: int = Field(2, ge=2)  # a burst divides the rollout's KV budget by this
    lease_s: float = Field(10.0, gt=0, allow_inf_nan=False)  # finished turns' prefix blocks kept this long
    chunk_tokens: int = Field(512, ge=1)  # rollout prefill chunk
    # a rollout turn with no progress this long (waiting for admission counts) is rerouted
    stall_timeout_s: float = Field(2.0, gt=0, allow_inf_nan=False)
    max_model_len: int = Field(2048, ge=2 * BLOCK_SIZE)  # a multiple of BLOCK_SIZE
    max_num_seqs: int = Field(64, ge=2)  # per engine; also the largest profiled decode batch
    usage_window_s: float = Field(30.0, gt=0, allow_inf_nan=False)  # "recent serving usage" for a step's budget
    # evict_reload mode (bench only): serving requests in flight that start a burst, and the calm
    # time before the rollout engine is rebuilt
    evict_load_threshold: int = Field(8, ge=1)
    reload_after_s: float = Field(2.0, gt=0, allow_inf_nan=False)
    profile_repeats: int = Field(3, ge=1)  # start-up latency profile: runs per point
    # no run holds the worker: its rollout engine is torn down (KV pages and weights given back
    # to serving) and rebuilt with the next borrowing run's weights (executors/coserving/parking.py)
    park_when_idle: bool = True
    # park from `rose up` on, before any run borrows the worker, so an idle stack lends serving
    # nothing (the first borrower's weight sync wakes it); off, the engine is built at `rose up`
    # and parks once a run that held it ends
    park_at_start: bool = True
    seed: int = 0

    @model_validator(mode="after")
    def _check_lengths(self) -> "CoServingSettings":
        if self.max_model_len % BLOCK_SIZE:
            raise ValueError(f"max_model_len must be a multiple of {BLOCK_SIZE} >= {2 * BLOCK_SIZE}, "
                             f"got {self.max_model_len}")
        if self.chunk_tokens > self.max_model_len:
            raise ValueError(f"chunk_tokens must be in 1..{self.max_model_len}, got {self.chunk_tokens}")
        full = self.max_model_len // BLOCK_SIZE + 1
        if self.kv_blocks is not None and self.kv_blocks < full:
            raise ValueError(f"kv_blocks={self.kv_blocks} cannot hold one {self.max_model_len}-token "
                             f"request; need >= {full}")
        return self


class StackConfig(Strict):
    """The local stack, or addresses of an existing one (cluster mode)."""

    # trainer workers trainer-0..N-1; a megatron run uses train.parallel tp x pp x dp of them
    trainers: int = Field(1, ge=1, le=64)
    rollout_workers: int = Field(1, ge=1, le=8)
    # the device class of rollout-0, rollout-1, ... (a Dask resource hw_<class> on the worker,
    # for rollout.hw_affinity); empty: every rollout worker is the one class "standard"
    rollout_device_classes: list[str] = []
    serving_workers: int = Field(0, ge=0, le=8)
    # CPU-only workers env-0..N-1 hosting the rollouts' environments (resource env_cpu); 0: the
    # environments step in the rollout driver's process
    env_workers: int = Field(0, ge=0, le=16)
    # the elastic reward pool (rose/stack/reward_pool.py): reward workers reward-i (reward_cpu),
    # started as the reward queue grows, between reward_workers_min (0: none while idle) and
    # this cap; 0: no pool, rewards come from the rollout's own environments
    reward_workers: int = Field(0, ge=0, le=64)
    reward_workers_min: int = Field(0, ge=0, le=64)
    reward_threads: int = Field(4, ge=1, le=256)  # trajectories one reward worker scores at once
    dask_scheduler: str | None = None  # e.g. tcp://10.0.0.1:8786; None = start locally
    # TLS to that scheduler (tls://...); the local stack on 127.0.0.1 stays plain TCP
    dask_tls: DaskTLS | None = None
    prefect_api_url: str | None = None  # e.g. http://10.0.0.1:4200/api; None = start locally
    relay: Literal["auto", "mooncake", "filesystem"] = "auto"  # auto: what the stack started
    # the Mooncake store client holding what is published (rose/stack/mooncake.py): every
    # process of this host shares its memory; 0: none (each publisher's own segment, TCP gets)
    relay_store_mb: int = Field(1024, ge=0)
    # engine workers' device: "cuda" (the `gpu` extra) splits each GPU between a serving
    # worker's two engines by memory fraction (executors/engine/device.py); never run on a GPU yet
    device: Device = "cpu"
    # serving workers: co-serving mode and serving SLO (both None: derived from the serving
    # model's start-up profile, reported in each endpoint's /metrics)
    serving_mode: StackServingMode = "rose"
    serving_slo_ttft_s: float | None = Field(None, gt=0)
    serving_slo_tpot_s: float | None = Field(None, gt=0)
    # serving endpoints' API keys: a file of keys, one per line (and ROSE_SERVING_API_KEY, read
    # by `rose up`); none: open, as on the local stack's 127.0.0.1. Paths answered without a key:
    serving_api_keys_file: Path | None = None
    serving_open_paths: list[str] = ["/health", "/metrics"]
    # each serving worker's co-serving executor: KV pool, reserve, burst watermark, cuts, leases
    coserving: CoServingSettings = CoServingSettings()

    @model_validator(mode="after")
    def _check_slo(self) -> "StackConfig":
        if (self.serving_slo_ttft_s is None) != (self.serving_slo_tpot_s is None):
            raise ValueError("set both serving_slo_ttft_s and serving_slo_tpot_s, or neither")
        return self

    @model_validator(mode="after")
    def _check_reward_pool(self) -> "StackConfig":
        if self.reward_workers_min > self.reward_workers:
            raise ValueError(f"stack.reward_workers_min ({self.reward_workers_min}) exceeds the pool's cap "
                             f"stack.reward_workers ({self.reward_workers})")
        return self

    @model_validator(mode="after")
    def _check_device_classes(self) -> "StackConfig":
        classes = self.rollout_device_classes
        if classes and len(classes) != self.rollout_workers:
            raise ValueError(f"stack.rollout_device_classes names {len(classes)} classes for "
                             f"{self.rollout_workers} rollout workers: give one per worker, or none")
        bad = [c for c in classes if not DEVICE_CLASS_PATTERN.fullmatch(c)]
        if bad:
            raise ValueError(f"stack.rollout_device_classes: {bad} are not class names (letters, digits, _)")
        return self

    @model_validator(mode="after")
    def _check_tls(self) -> "StackConfig":
        if self.dask_tls is not None and not (self.dask_scheduler or "").startswith("tls://"):
            raise ValueError(f"stack.dask_tls needs stack.dask_scheduler: tls://host:port, the "
                             f"address of a cluster's TLS scheduler (got {self.dask_scheduler!r}; "
                             "the local stack on 127.0.0.1 stays plain TCP)")
        return self


class StepLatencyConfig(Strict):
    """Seconds each environment step sleeps first, drawn per step (envs/latency.py): slow
    environments for benchmarks. normal: N(mean_s, std_s) clipped at 0."""

    dist: Literal["normal"] = "normal"
    mean_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    std_s: float = Field(0.0, ge=0, allow_inf_nan=False)


class RewardConfig(Strict):
    """Where trajectory rewards are scored. env: the rollout's environments' rewards, summed as
    each trajectory ends (no pool); elastic: each trajectory scored on the stack's reward pool
    as soon as it ends, while the rollout goes on (RollArt's serverless reward; needs `rose up
    --reward-workers N`); batch: every trajectory scored on the pool after the rollout (the
    baseline elastic is measured against)."""

    service: Literal["env", "elastic", "batch"] = "env"
    # seconds a reward model would take per trajectory, drawn per trajectory (benchmarks: the
    # environments' verifiers take microseconds); None: the verifier's own time
    cost: StepLatencyConfig | None = None
    timeout_s: float = Field(300.0, gt=0, allow_inf_nan=False)  # the last reward's wait


class SchedulerConfig(Strict):
    """The elastic rollout scheduler's settings (executors/scheduling/scheduler.py); flat keys
    of `rollout` in a run config."""

    max_concurrency_per_worker: int = Field(16, ge=1)  # turns in flight per dedicated rollout worker
    routing: RoutingMode = "turnwise_affinity"  # executors/policies/router.py
    serving_max_turns_per_worker: int = Field(16, ge=1)  # rollout turns queued on a serving GPU
    admission_refresh_s: float = Field(0.3, gt=0)  # how often a serving worker's admission is polled
    heartbeat_s: float = Field(0.5, gt=0, le=10)  # how often the scheduler checks worker liveness
    max_rejoins: int = Field(1, ge=0)  # times a worker that came back may rejoin the step
    max_attempts_per_turn: int = Field(5, ge=1)  # a turn rerouted more often fails its trajectory
    turn_timeout_s: float = Field(120.0, gt=0)  # a worker silent this long on a batch is excluded
    stuck_after_s: float = Field(600.0, gt=0)  # no turn finished this long: RolloutStuck
    # threads stepping blocking environments (MultiTurnEnv.blocking) at once, off the loop's
    env_threads: int = Field(64, ge=1, le=1024)
    # trajectory: each trajectory's next turn goes out when its own environment step is done;
    # batched: when every trajectory's is (a turn-wide barrier: the baseline bench/stack/env_async.py
    # measures against, as RollArt does)
    env_stepping: Literal["trajectory", "batched"] = "trajectory"
    # fetching a finished batch's results; a worker that died holding them makes Dask
    # recompute the batch on that dead address, i.e. wait forever: rerouted instead
    result_timeout_s: float = Field(30.0, gt=0)
    max_batch_failures: int = Field(3, ge=1)  # failed batches before a worker is excluded
    # versions a borrowed serving worker's turn may lag the trainer in all while its pull
    # completes in the background; RunConfig.max_staleness takes that many of them already (the
    # scheduler gets the rest: flows/rl_step.serving_lag_cfg). Dedicated rollout workers never lag.
    serving_lag: int = Field(1, ge=0)
    # a borrowed turn out this many dedicated median turn times while a rollout GPU idles is
    # taken back and rerouted there (executors/policies/tail_handback.py); 0 = never
    handback_factor: float = Field(4.0, ge=0, allow_inf_nan=False)
    # environment tag (or "default") -> the device class its turns prefer (RollArt's hardware
    # affinity: executors/policies/hw_affinity.py), e.g. {frozenlake: compute, default: bandwidth};
    # a class no rollout worker has is refused when the run starts. Empty: no preference.
    hw_affinity: dict[str, str] = {}

    @field_validator("hw_affinity")
    @classmethod
    def _known_tags(cls, mapping: dict[str, str]) -> dict[str, str]:
        tags = (*get_args(EnvName), "default")
        unknown = sorted(set(mapping) - set(tags))
        if unknown:
            raise ValueError(f"hw_affinity tags {unknown} are not environments; known: {list(tags)}")
        bad = sorted(c for c in mapping.values() if not DEVICE_CLASS_PATTERN.fullmatch(c))
        if bad:
            raise ValueError(f"hw_affinity classes {bad} are not class names (letters, digits, _)")
        return mapping

    @model_validator(mode="after")
    def _check_handback(self) -> "SchedulerConfig":
        if 0 < self.handback_factor < 1:
            raise ValueError(f"handback_factor must be 0 (off) or >= 1, got {self.handback_factor}: "
                             "a turn cannot be due before a dedicated GPU would have finished it")
        return self


class RolloutConfig(SchedulerConfig):
    env: EnvName = "frozenlake"
    env_step_latency: StepLatencyConfig | None = None  # None: environments step at their own speed
    # an environment worker that has not answered a step this long is given up on: the
    # trajectory's environment is rebuilt on another (executors/scheduling/remote_env.py)
    env_step_timeout_s: float = Field(60.0, gt=0)
    groups: int = Field(16, ge=1)  # GRPO groups per step (16 maps: a less noisy step signal)
    group_size: int = Field(8, ge=2)  # trajectories per group, sharing the initial state
    max_turns: int = Field(8, ge=1)
    max_tokens_per_turn: int = Field(12, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    borrow_serving: bool = True  # False: serving workers only serve; turns stay on rollout GPUs
    # DAPO dynamic sampling: launch groups until `groups` of them have reward variance, abort the
    # surplus; only those groups reach the step. The next step's launch comes from this one's
    # keep rate (persisted in the run dir).
    dynamic_sampling: bool = False
    dynamic_sampling_oversample: float = Field(1.5, ge=1)  # first launch: ceil(groups * this)
    dynamic_sampling_max_launch: float = Field(4.0, ge=1)  # cap: ceil(groups * this) per step

    @model_validator(mode="after")
    def _check_settings(self) -> "RolloutConfig":
        if self.dynamic_sampling_max_launch < self.dynamic_sampling_oversample:
            raise ValueError(f"dynamic_sampling_max_launch ({self.dynamic_sampling_max_launch}) "
                             f"must be >= dynamic_sampling_oversample "
                             f"({self.dynamic_sampling_oversample})")
        return self


class TrainParallel(Strict):
    """The megatron backend's layout: tensor, pipeline and data parallel sizes; the group has
    tp x pp x dp ranks, one per trainer worker (`rose up --trainers N`)."""

    tp: int = Field(1, ge=1, le=64)
    pp: int = Field(1, ge=1, le=64)
    dp: int = Field(1, ge=1, le=1024)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


class TrainConfig(Strict):
    # hf: one process, the Hugging Face model (the demo's ~1M-parameter policy); megatron:
    # megatron-core across tp x pp x dp ranks (executors/training/), as the paper trains
    backend: Literal["hf", "megatron"] = "hf"
    parallel: TrainParallel = TrainParallel()
    # tuned on the ~1M-parameter demo policy (docs/learning_curve.md): 2e-5 stays flat over 40
    # steps, 1e-3 collapses now and then, 5e-4 climbs steadily
    lr: float = Field(5e-4, gt=0)
    clip_eps: float = Field(0.2, gt=0, lt=1)
    # turns from an older policy version (serving workers may lag rollout.serving_lag) are
    # weighted per token by min(pi_trainer / pi_rollout, tis_cap): truncated importance sampling
    tis_cap: float = Field(2.0, gt=0)
    kl_coef: float = Field(0.0, ge=0)  # >0 keeps a frozen reference model for a KL penalty
    micro_batch: int = Field(16, ge=1)  # trajectories per forward/backward
    updates_per_step: int = Field(1, ge=1)
    max_grad_norm: float = Field(1.0, gt=0)
    seed: int = 0
    keep_checkpoints: int = Field(3, ge=1)  # newest kept in <run dir>/checkpoints
    # torch threads of the hf trainer (on a loaded 2-core machine two threads ran 4x slower)
    threads: int = Field(1, ge=1, le=1024)

    @model_validator(mode="after")
    def _check_layout(self) -> "TrainConfig":
        if self.backend == "hf" and self.parallel.world > 1:
            raise ValueError(f"train.parallel {self.parallel.tp}x{self.parallel.pp}x{self.parallel.dp} "
                             "needs train.backend: megatron (the hf backend is one process)")
        return self


class PublishConfig(Strict):
    bucket_bytes: int = Field(64 * MB, ge=1 * MB)
    pull_batch_bytes: int = Field(1024 * MB, ge=1 * MB)
    sparse: bool = True  # lossless bf16 deltas after the first full snapshot
    # the trainer-to-engines link: each tensor goes coded or raw, whichever the time model
    # (storage/delta/time_model.py) says reaches the engines first over this rate
    link_gbps: float = Field(10.0, gt=0, le=10_000)
    # choose by the rate the transfers measure instead, once they have (the trainer's bucket
    # puts, the engines' gets; transfers of 16 MB and up: storage/weights/link_rate.py)
    measure_link: bool = True
    # cost coding at the trainer host's own speed, probed once per process (0.15-0.5 s at its
    # first delta), not at the time model's costs fitted on the project's VM
    # (storage/delta/host_speed.py)
    measure_cpu: bool = True
    # The trainer's publish layout. None (default): one unsharded version. N: sharded
    # (storage/weights/sharded_publisher.py): the trainer, one process (layout TP=1), pushes each
    # tensor-parallel tensor as N slices in parts of their own, so an engine rank of TP up to N
    # pulls only its slices (engines here are TP=1: they pull every part)
    shard_split: int | None = Field(None, ge=1, le=64)
    # engines start their pulls before the push (unsharded only): a coded delta is then applied
    # bucket by bucket while the trainer still encodes the rest (storage/weights/stream_pull.py)
    stream: bool = True
    # code a delta's tensors in this many processes of their own (unsharded only): the trainer
    # takes its bf16 snapshot into shared memory and each process reads it there, with a GIL
    # of its own (storage/weights/coder_processes.py). 0: threads of the trainer process,
    # which the Python around the kernels holds the GIL for: on 8 cores and more that is the
    # publish's floor (bench/transfer/transfer_gil.py); on 2 shared cores processes cost ~10% more CPU
    coder_processes: int = Field(0, ge=0, le=256)


class BorrowConfig(Strict):
    """Which serving workers a run borrows (executors/policies/borrow.py): each RL step it takes
    up to `max_serving_workers` of those no other run holds, lowest serving load first, each
    under a lease naming the run, renewed by its driver and released when the run ends."""

    max_serving_workers: int | None = None  # None: every serving worker no other run holds
    lease_ttl_s: float = Field(60.0, gt=0, allow_inf_nan=False)  # a driver silent this long frees its workers

    @field_validator("max_serving_workers")
    @classmethod
    def _at_least_one(cls, n: int | None) -> int | None:
        if n is not None and n < 1:
            raise ValueError(f"must be >= 1 or unset (every free serving worker), got {n}; to borrow "
                             "none set rollout.borrow_serving: false")
        return n


class CoexecConfig(Strict):
    """Co-execution groups (RollMux; executors/policies/coexec_group.py, flows/coexec.py): runs in
    one group share the rollout and trainer workers, each phase taking its pool's permit in turn,
    so one run rolls out while another trains."""

    group: str = Field("", pattern=r"^[A-Za-z0-9_.-]*$")  # "": the run drives its phases alone
    slo_factor: float = Field(2.0, ge=1, allow_inf_nan=False)  # its step may take this x its solo step
    # host memory each pool has for the group's parked states; None: what this host has free
    host_memory_gib: float | None = Field(None, gt=0, allow_inf_nan=False)
    member_ttl_s: float = Field(60.0, gt=0, allow_inf_nan=False)  # a driver silent this long leaves


# Keys that moved, old -> new, both as paths; a config with the old key still loads.
MOVED_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("publish", "max_staleness"): ("rollout", "serving_lag"),
}


def move_keys(data: dict) -> dict:
    """`data` (a run config's keys) with the moved keys at their new place."""
    out = dict(data)
    for old, new in MOVED_KEYS.items():
        parent = out.get(old[0])
        if not isinstance(parent, dict) or old[1] not in parent:
            continue
        target = dict(out.get(new[0]) or {})
        if new[1] in target:
            raise ValueError(f"{'.'.join(old)} is now {'.'.join(new)}: give only {'.'.join(new)}")
        target[new[1]] = parent[old[1]]
        out[old[0]] = {k: v for k, v in parent.items() if k != old[1]}
        out[new[0]] = target
    return out


class RunConfig(Strict):
    run_id: str = Field("demo", pattern=r"^[A-Za-z0-9_.-]+$")
    steps: int = Field(5, ge=1)
    checkpoint_every: int = Field(1, ge=1)  # every step: a restart resumes where it stopped
    seed: int = 0
    # versions every turn's policy may lag the trainer that trains on it: step s rolls out with
    # version s-1-max_staleness (0: synchronous; 1: one-step off-policy, step s+1's rollout runs
    # while step s trains; flows/pipeline.py). rollout.serving_lag lets borrowed serving
    # workers' turns lag further.
    max_staleness: int = Field(0, ge=0, le=1)
    models: ModelsConfig = ModelsConfig()
    stack: StackConfig = StackConfig()
    rollout: RolloutConfig = RolloutConfig()
    borrow: BorrowConfig = BorrowConfig()
    coexec: CoexecConfig = CoexecConfig()
    reward: RewardConfig = RewardConfig()
    train: TrainConfig = TrainConfig()
    publish: PublishConfig = PublishConfig()
    fault_injection: dict[str, int] = Field(default_factory=dict)  # tests only: {"train": step}

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: object) -> object:
        return move_keys(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check(self) -> "RunConfig":
        if self.rollout.groups * self.rollout.group_size < 2:
            raise ValueError("a step needs at least two trajectories")
        if self.rollout.env not in self.models.demo_envs:
            raise ValueError(f"rollout.env {self.rollout.env} is not in models.demo_envs {self.models.demo_envs}: "
                             "the policy would never have seen it; add it there")
        if self.coexec.group and self.max_staleness:
            raise ValueError("coexec.group takes turns phase by phase: it needs max_staleness 0")
        return self

    @property
    def publishes_sharded(self) -> bool:
        """Versions go out as shards (storage/weights/sharded_publisher.py): asked for with
        publish.shard_split, or a megatron trainer, whose every rank pushes its own shard."""
        return self.publish.shard_split is not None or self.train.backend == "megatron"

    def run_dir(self) -> Path:
        return data_dir() / "runs" / self.run_id

    def trajectories_dir(self) -> Path:
        return data_dir() / "trajectories"
