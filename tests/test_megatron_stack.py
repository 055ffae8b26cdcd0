"""A megatron trainer group on the real stack: `rose up --trainers 2`, train.parallel tp=2.

Slow: two trainer workers form a gloo group through the Dask scheduler, train a step, both
ranks publish their shards through Mooncake, the rollout engine computes with exactly the
trainer's weights (read from inside vLLM), and after trainer-1's process is killed the run
resumes from the group's checkpoint: the group forms again, nothing lost or repeated.
(One stack for the whole module: ~3 min.)
"""
from __future__ import annotations

import json
import os
import signal
import uuid

import pytest

from tests.stack_fixtures import engine_mismatches, in_process_stack

pytestmark = [pytest.mark.slow, pytest.mark.models]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from core.config import StackConfig

    with in_process_stack(tmp_path_factory, "rose-megatron",
                          config=StackConfig(trainers=2, rollout_workers=1, relay="mooncake")) as handle:
        yield handle


def _group_weights(scheduler: str, cfg) -> dict:
    """The trainer group's bf16 model, assembled from both ranks' slices."""
    from distributed import Client

    from executors.workers.publishers import policy_full_specs
    from executors.workers.trainer import local_trainer
    from storage.shards.plan import assemble
    import torch

    def held(run: str):
        t = local_trainer(run)
        return t.layout_rank, {n: w.view(torch.int16) for n, w in t.weights_bf16().items()}

    with Client(scheduler) as client:
        ranks = [client.submit(held, cfg.run_id, workers=[f"trainer-{r}"], pure=False).result()
                 for r in range(2)]
    by_tp = {rank[0]: {n: w.view(torch.bfloat16) for n, w in held.items()} for rank, held in ranks}
    return {p.name: assemble([by_tp[0][p.name], by_tp[1][p.name]], p.rule, p.shape)
            for p in policy_full_specs(cfg)}


def test_tp2_group_trains_publishes_and_resumes_after_a_killed_rank(stack):
    from distributed import Client

    from flows.train import train
    from core.config import RolloutConfig, RunConfig, TrainConfig, TrainParallel
    from storage.trajectories.dataset import TrajectoryStore
    from storage.weights.transfer_metrics import transfer_path

    cfg = RunConfig(run_id=f"mg-{uuid.uuid4().hex[:8]}", steps=1,
                    rollout=RolloutConfig(groups=2, group_size=4, max_turns=3),
                    train=TrainConfig(backend="megatron", parallel=TrainParallel(tp=2)))
    summaries = train(cfg)
    assert [s["policy_version"] for s in summaries] == [1]
    assert engine_mismatches(stack.dask_scheduler, cfg.run_id,
                             trainer_weights=_group_weights(stack.dask_scheduler, cfg)) == []
    import pyarrow.parquet as pq

    record = pq.read_table(transfer_path(cfg.run_dir(), 1)).to_pylist()[0]
    pushed = json.loads(record["rank_bytes"])
    assert set(pushed) == {"r0.0.0", "r1.0.0"} and all(b > 0 for b in pushed.values())
    assert json.loads(record["worker_pulled_bytes"])["rollout-0"] > 0

    with Client(stack.dask_scheduler) as client:  # trainer-1's process is killed; its nanny restarts it
        addr = next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                    if w["name"] == "trainer-1")
        pid = client.run(os.getpid, workers=[addr])[addr]
    os.kill(pid, signal.SIGKILL)
    more = train(cfg.model_copy(update={"steps": 2}))
    assert [s["policy_version"] for s in more] == [2]
    assert TrajectoryStore(cfg.trajectories_dir()).read_step(cfg.run_id, 2).num_rows > 0
    trained = sorted(p.name for p in (cfg.run_dir() / "train").iterdir())
    assert trained == ["step-00000001.json", "step-00000002.json"]
    second = json.loads(pq.read_table(transfer_path(cfg.run_dir(), 2)).to_pylist()[0]["rank_bytes"])
    assert set(second) == {"r0.0.0", "r1.0.0"}  # the re-formed group: both ranks pushed again
    assert engine_mismatches(stack.dask_scheduler, cfg.run_id,
                             trainer_weights=_group_weights(stack.dask_scheduler, cfg)) == []
