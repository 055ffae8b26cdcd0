"""The chaos bench's harness: a fresh local stack per fault (or several faults' runs in turn on
one stack), `rose` commands with deadlines, and what a finished (or abandoned) run left behind,
read from outside the product.

Every `rose` command runs as a user runs it (its own process group, so a command past its
deadline is killed whole and reported as a hang instead of being waited for). Nothing here
reaches into a live product process except through the Dask scheduler and the stack file.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    rc: int | None  # None: killed at its deadline (a hang)
    seconds: float
    stdout: str = ""
    stderr: str = ""

    @property
    def hung(self) -> bool:
        return self.rc is None

    def tail(self, n: int = 600) -> str:
        return (self.stderr.strip() or self.stdout.strip())[-n:]


def run_rose(args: list[str], env: dict[str, str], deadline_s: float) -> Outcome:
    """`rose <args>` in its own process group; killed (group and all) at the deadline."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rose.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=deadline_s)
        return Outcome(proc.returncode, time.monotonic() - t0, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and anything it forked
        out, err = proc.communicate()
        return Outcome(None, time.monotonic() - t0, out, err)


@dataclass
class Bed:
    """One fault's stack: its data directory, the run's config file, the CLI environment."""

    name: str
    data: Path
    run_id: str
    config: dict
    env: dict[str, str] = field(default_factory=dict)
    keep: object | None = None  # a relay client a fault left open (closed before `rose down`)
    config_name: str = "run.json"

    @classmethod
    def fresh(cls, root: Path, name: str, models: Path, config: dict) -> "Bed":
        data = root / name
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        (data / "models").symlink_to(models.resolve(), target_is_directory=True)
        run_id = f"chaos-{name}"
        cfg = {**config, "run_id": run_id}
        (data / "run.json").write_text(json.dumps(cfg, indent=1))
        # another stack's Prefect/Mooncake settings must not leak into this one's commands
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PREFECT_", "ROSE_MOONCAKE", "ROSE_RELAY", "ROSE_RUN_DIR",
                                    "ROSE_DASK"))}
        env["ROSE_DATA_DIR"] = str(data)
        return cls(name, data, run_id, cfg, env)

    def run_on(self, name: str, config: dict) -> "Bed":
        """Another run, its own id and config file, on this bed's stack (up or not)."""
        run_id = f"chaos-{name}"
        cfg = {**config, "run_id": run_id}
        bed = Bed(name, self.data, run_id, cfg, dict(self.env), config_name=f"{run_id}.json")
        bed.config_file.write_text(json.dumps(cfg, indent=1))
        return bed

    @property
    def config_file(self) -> Path:
        return self.data / self.config_name

    @property
    def run_dir(self) -> Path:
        return self.data / "runs" / self.run_id

    def rose(self, args: list[str], deadline_s: float) -> Outcome:
        return run_rose(args, self.env, deadline_s)

    def up(self, deadline_s: float = 420) -> Outcome:
        out = self.rose(["up", "-c", str(self.config_file)], deadline_s)
        if out.rc != 0:
            raise RuntimeError(f"rose up failed for {self.name}: {out.tail()}")
        return out

    def down(self, deadline_s: float = 180) -> Outcome:
        return self.rose(["down"], deadline_s)

    def stack(self) -> dict:
        """The stack file `rose up` wrote: addresses and the pid of every service."""
        return json.loads((self.data / "stack" / "stack.json").read_text())

    def pid_of(self, name: str) -> int:
        return next(p["pid"] for p in self.stack()["processes"] if p["name"] == name)

    def checkpoints(self) -> list[int]:
        from storage.checkpoints import checkpoint_steps

        return checkpoint_steps(self.run_dir / "checkpoints")


class Progress(threading.Thread):
    """From the moment of injection: seconds until the run wrote a checkpoint it did not have
    then (it trained again: recovered), or None."""

    def __init__(self, bed: Bed) -> None:
        super().__init__(name=f"progress-{bed.name}", daemon=True)
        self.bed, self.t_inject, self.recovered_s = bed, None, None
        self._base: set[int] = set()
        self._halt = threading.Event()

    def injected(self) -> None:
        self._base, self.t_inject = set(self.bed.checkpoints()), time.monotonic()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            if self.t_inject is not None and self.recovered_s is None \
                    and set(self.bed.checkpoints()) - self._base:
                self.recovered_s = time.monotonic() - self.t_inject

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)


def expected_trajectories(cfg: dict, step: int) -> set[str]:
    from storage.trajectories.schema import trajectory_id

    r = cfg["rollout"]
    return {trajectory_id(step, g, i) for g in range(r["groups"]) for i in range(r["group_size"])}


def dataset_check(bed: Bed) -> dict:
    """Trajectories lost (expected, not whole in the Arrow dataset), duplicate (trajectory,
    turn) rows, and turns recorded as rerouted, over the run's steps."""
    from storage.trajectories.dataset import TrajectoryStore

    store = TrajectoryStore(bed.data / "trajectories")
    lost = dup = rerouted = 0
    for step in range(1, bed.config["steps"] + 1):
        want = expected_trajectories(bed.config, step)
        try:
            rows = store.read_step(bed.run_id, step).to_pylist()
        except (OSError, FileNotFoundError, ValueError):
            rows = []
        keys = [(r["trajectory"], r["turn"]) for r in rows]
        dup += len(keys) - len(set(keys))
        rerouted += sum(r["status"] == "rerouted" for r in rows)
        whole = {t for t in want if _whole([r for r in rows if r["trajectory"] == t])}
        lost += len(want - whole)
    return {"trajectories_lost": lost, "duplicate_rows": dup, "rerouted_rows": rerouted}


def _whole(turns: list[dict]) -> bool:
    turns = sorted(turns, key=lambda r: r["turn"])
    return bool(turns) and [r["turn"] for r in turns] == list(range(len(turns))) \
        and turns[-1]["done"] and all(r["advantage"] is not None for r in turns)


def weights_check(bed: Bed) -> dict:
    """The final checkpoint's bf16 digest against a trainer that replays the run's own
    trajectories from the initial policy. Why not a second fault-free run: rollout sampling
    draws from each engine's one seeded generator in turn-arrival order, so no two stack runs
    sample the same trajectories; training is deterministic given them."""
    import torch

    from storage.weights.digest import tensors_digest
    from executors.workers.trainer import Trainer
    from core.config import RunConfig
    from storage.checkpoints import load_latest_checkpoint
    from storage.trajectories.dataset import TrajectoryStore

    ckpt = load_latest_checkpoint(bed.run_dir / "checkpoints")
    steps = bed.config["steps"]
    if ckpt is None or ckpt.step != steps:
        return {"weights_equal": None, "final_checkpoint": ckpt.step if ckpt else None}
    old = os.environ.get("ROSE_DATA_DIR")
    os.environ["ROSE_DATA_DIR"] = str(bed.data)  # Trainer finds models and runs under it
    try:
        torch.set_num_threads(1)  # as the trainer worker (train.threads default)
        cfg = RunConfig.model_validate({**bed.config, "run_id": f"{bed.run_id}-reference"})
        shutil.rmtree(cfg.run_dir(), ignore_errors=True)
        reference = Trainer(cfg)
        initial = tensors_digest(reference.weights_bf16())
        store = TrajectoryStore(bed.data / "trajectories")
        for step in range(1, steps + 1):
            reference.train_step(store.read_step(bed.run_id, step))
        ref = tensors_digest(reference.weights_bf16())
    finally:
        if old is None:
            os.environ.pop("ROSE_DATA_DIR", None)
        else:
            os.environ["ROSE_DATA_DIR"] = old
    got = tensors_digest({n: t.to(torch.bfloat16).contiguous()
                          for n, t in ckpt.model_state.items()})
    # with no informative group (every reward in each group equal) GRPO does not move the
    # weights: equal then says nothing, and the row says so
    return {"weights_equal": got == ref, "weights_moved": ref != initial,
            "final_checkpoint": ckpt.step, "final_digest": got, "reference_digest": ref}
