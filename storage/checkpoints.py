"""Training checkpoints: <dir>/step-<NNNNNNNN>/{model.safetensors, optimizer.pt, meta.json}.

A checkpoint is written into a hidden temporary directory, fsynced, then renamed into place, so
a crash leaves either the complete checkpoint or none (a leftover temporary directory is
ignored and cleaned by the next save). The last `keep` checkpoints are kept.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

MODEL_FILE, OPTIMIZER_FILE, META_FILE = "model.safetensors", "optimizer.pt", "meta.json"
FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


class CorruptCheckpoint(RuntimeError):
    """A checkpoint directory exists but cannot be read."""


@dataclass
class Checkpoint:
    step: int
    path: Path
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = ((_STEP_DIR.match(p.name), p) for p in root.iterdir() if p.is_dir())
    return sorted((int(m.group(1)), p) for m, p in found if m)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors; tensors sharing storage (tied embeddings) are cloned, since
    safetensors refuses shared memory."""
    out, seen = {}, set()
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"model_state[{name!r}] is a {type(t).__name__}, not a tensor")
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        out[name] = t.clone() if ptr in seen else t
        if ptr is not None:
            seen.add(ptr)
    return out


def save_checkpoint(dir: Path | str, step: int, model_state: dict[str, torch.Tensor],
                    optimizer_state: dict[str, Any], meta: dict[str, Any] | None = None,
                    keep: int = 3) -> Path:
    """Write the checkpoint of `step` atomically and keep the newest `keep`; returns its path."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    tmp = new_partial(dir, step)
    try:
        info = {"format": FORMAT, "step": step, "saved_at": time.time(), "meta": meta or {}}
        json.dumps(info)  # fails early on non-JSON meta
        save_file(_unshared(model_state), str(tmp / MODEL_FILE), metadata={"step": str(step)})
        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        for name in (MODEL_FILE, OPTIMIZER_FILE):
            _fsync(tmp / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return commit_partial(tmp, step, info, keep)


def new_partial(dir: Path | str, step: int) -> Path:
    """A fresh hidden directory to write the checkpoint of `step` into (commit_partial makes
    it the checkpoint); other writers' files (a distributed save's ranks) may go in it too."""
    root = Path(dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step-{step:08d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def commit_partial(tmp: Path, step: int, info: dict[str, Any], keep: int) -> Path:
    """Write meta.json into a fully written partial checkpoint, then rename it into place
    atomically (replacing a checkpoint of the same step) and keep the newest `keep`."""
    root, final = tmp.parent, tmp.parent / f"step-{step:08d}"
    try:
        (tmp / META_FILE).write_text(json.dumps(info, indent=1))
        _fsync(tmp / META_FILE)
        if final.exists():  # re-saving a step: move the old one aside, then swap
            old = root / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for _, old in _step_dirs(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):  # left by a crashed save
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def latest_step_dir(dir: Path | str) -> tuple[int, Path] | None:
    """(step, path) of the newest checkpoint under `dir`, or None."""
    dirs = _step_dirs(Path(dir))
    return dirs[-1] if dirs else None


def load_checkpoint(path: Path | str) -> Checkpoint:
    path = Path(path)
    try:
        info = json.loads((path / META_FILE).read_text())
        model_state = load_file(str(path / MODEL_FILE))
        # weights_only: optimizer state is tensors and plain containers; refuse anything else.
        optimizer_state = torch.load(path / OPTIMIZER_FILE, weights_only=True)
    except Exception as e:  # safetensors, pickle and json each raise their own kinds
        raise CorruptCheckpoint(f"checkpoint {path} unreadable: {type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}") from None
    return Checkpoint(int(info["step"]), path, model_state, optimizer_state, info.get("meta", {}))


def load_latest_checkpoint(dir: Path | str) -> Checkpoint | None:
    """The newest checkpoint under `dir`, or None if there is none."""
    latest = latest_of_format(dir, FORMAT)
    return load_checkpoint(latest[1]) if latest else None


def latest_of_format(dir: Path | str, fmt: object) -> tuple[int, Path, dict[str, Any]] | None:
    """(step, path, meta.json) of the newest checkpoint under `dir`, or None; a ValueError when
    another trainer backend wrote it (its meta.json names another format)."""
    latest = latest_step_dir(dir)
    if latest is None:
        return None
    step, path = latest
    try:
        info = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"checkpoint {path} unreadable: {type(e).__name__}: {e}") from None
    if info.get("format") != fmt:
        raise ValueError(f"checkpoint {path} was written by another trainer backend (format "
                         f"{info.get('format')!r}): resume the run with the train.backend that wrote it")
    return step, path, info


def checkpoint_steps(dir: Path | str) -> list[int]:
    return [s for s, _ in _step_dirs(Path(dir))]
