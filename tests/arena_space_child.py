"""Run by tests/test_arena_space.py in a mount namespace whose /dev/shm is a 1 MiB tmpfs: makes
arenas that do not fit, then publishes with coder processes on; prints what it saw as JSON."""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from executors.workers.trainer import Trainer  # noqa: E402
from storage.relay.filesystem import FilesystemRelay  # noqa: E402
from storage.weights.receiver import WeightReceiver  # noqa: E402
from storage.weights.sparse_publisher import SparsePublisher  # noqa: E402
from storage.weights.tensor_arena import ArenaSpaceError, TensorArena, arena_copy, arena_of  # noqa: E402


def main() -> None:
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("storage.weights.tensor_arena").addHandler(handler)
    g = torch.Generator().manual_seed(0)
    v1 = {f"model.layers.{i}.mlp.up_proj.weight": torch.randn(512, 512, generator=g)
          .to(torch.bfloat16) for i in range(4)}  # 2 MiB: no room in 1 MiB
    v2 = {n: (t.float() * 1.001).to(torch.bfloat16) for n, t in v1.items()}
    out: dict = {}
    try:
        TensorArena(v1)
        out["error"] = None
    except ArenaSpaceError as e:
        out["error"] = e.strerror
    out["left_in_shm"] = sorted(os.listdir("/dev/shm"))
    out["arena_copies"] = [arena_copy(v1, torch.float32), arena_copy(v1)]
    trainer = SimpleNamespace(model=torch.nn.ParameterDict(  # Trainer's snapshot, these weights
        {n.replace(".", "_"): torch.nn.Parameter(t.float()) for n, t in v1.items()}))
    snapshot = Trainer.weights_bf16(trainer, shared=True)
    out["snapshot_equal"] = all(torch.equal(snapshot[n.replace(".", "_")], t)
                                for n, t in v1.items())
    out["snapshot_in_arena"] = arena_of(snapshot) is not None
    with tempfile.TemporaryDirectory() as tmp:
        relay = FilesystemRelay(Path(tmp) / "relay")
        pub = SparsePublisher(relay, "small-shm", link_gbps=0.05, coder_processes=1)
        rx = WeightReceiver(relay, "small-shm", "rx")
        digests = []
        for version, weights in ((1, v1), (2, v2)):
            digests.append(pub.publish(version, weights).digest)
            rx.pull(version)
        out["digests_match"] = rx.digest == digests[-1]
        out["received_equal"] = all(torch.equal(rx.tensors[n].view(torch.int16),
                                                v2[n].view(torch.int16)) for n in v2)
    out["warnings"] = warnings
    print(json.dumps(out))


if __name__ == "__main__":
    main()
