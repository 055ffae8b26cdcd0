"""This trainer process's place in a megatron trainer group (tasks/trainer_group.py forms the
group across the stack's trainer workers and calls its ranks).

Rank r joins torch.distributed at the (host, port) the caller chose on trainer-0's host (gloo on
CPU, NCCL on CUDA) and builds its MegatronTrainer, which resumes the run's newest checkpoint.
The group is named by that address: a caller that finds ranks in different groups (a rank
restarted: its new process is in none; another run's group) has every rank join a new one.
One group per process: torch.distributed and megatron's parallel state are per process.
"""
from __future__ import annotations

import socket
import threading
from typing import Any

from core.config import RunConfig

_held: dict[str, Any] = {}  # this process's membership: run, group, trainer
_lock = threading.Lock()


def rendezvous_point() -> tuple[str, int]:
    """A free port on this host, for the group's store (called on trainer-0)."""
    host = socket.gethostbyname(socket.gethostname())
    with socket.socket() as s:
        s.bind((host, 0))
        return host, s.getsockname()[1]


def held_group(run: str) -> str | None:
    """The group this process is a rank of for `run`, or None."""
    return _held.get("group") if _held.get("run") == run else None


def join_group(cfg: RunConfig, rank: int, host: str, port: int, device: str = "cpu") -> int:
    """Leave any group this process holds, join rank `rank` of the one at host:port and build
    this rank's trainer; its policy version."""
    from executors.training.megatron_trainer import MegatronTrainer
    from executors.training.process_group import join, leave

    with _lock:
        _held.clear()
        leave()
        join(rank, cfg.train.parallel, f"tcp://{host}:{port}", device)
        trainer = MegatronTrainer(cfg, device)
        _held.update(run=cfg.run_id, group=f"{host}:{port}", trainer=trainer)
        return trainer.version


def group_trainer(run: str):
    """This rank's MegatronTrainer of `run` (joined through join_group)."""
    trainer = _held.get("trainer") if _held.get("run") == run else None
    if trainer is None:
        raise RuntimeError(f"this worker is no rank of run {run!r}'s trainer group: "
                           "tasks/trainer_group.py forms it before calling a rank")
    return trainer
