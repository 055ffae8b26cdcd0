"""The paper-figures flow runs sim/paper_figures.py's simulations as Prefect tasks on Dask
(flows/paper_figures.py), as tests/test_cluster_sim_flow.py does for the sweep.

Slow-ish (Prefect's temporary server and a local Dask cluster start, ~30 s): a tiny configuration
(one step of the small fitted FrozenLake workload, Fig. 1 and Fig. 7 under DAPO: 8 simulations
in 3 batches, the DAPO ROSE runs judged at the SLO their fixed runs set); one task per
simulation, and the figures equal those of the same run in this process.
"""
from __future__ import annotations

import json

import pytest

import sim.paper_figures as figures
from flows.paper_figures import PaperFiguresRequest

pytestmark = pytest.mark.slow

TINY = PaperFiguresRequest(steps=1, workload="workload_frozenlake", figures=["fig1", "dapo"])
TIMED = {"wall_s", "cpu_s", "route_p99_ms", "total_s"}  # what the machine, not the model, decides


def _untimed(x):
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if k not in TIMED}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def test_the_request_is_the_figures_options():
    args = figures.parser().parse_args(TINY.argv())
    assert (args.steps, args.workload, args.figures, args.fleet) == (1, "workload_frozenlake", ["fig1", "dapo"],
                                                                     "h100_qwen3_8b")
    assert figures.parser().parse_args(PaperFiguresRequest().argv()).figures == list(figures.FIGURES)
    with pytest.raises(ValueError):
        PaperFiguresRequest(figures=["fig9"])


def test_the_flow_runs_one_task_per_simulation_and_matches_a_local_run(monkeypatch, tmp_path):
    from distributed import LocalCluster
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    from flows.paper_figures import paper_figures

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))  # no local stack here
    batches = []

    def one_by_one(jobs):
        batches.append(len(jobs))
        return figures._one_by_one(jobs)

    def write(out, doc):
        out.write_text(json.dumps(doc))

    with figures.runner(one_by_one):
        args = figures.parser().parse_args(TINY.model_copy(update={"out": str(tmp_path / "local.json")}).argv())
        local = figures.write_figures(args, write)
    assert batches == [2, 3, 3]  # Fig. 1's two; DAPO's fixed runs, then ROSE at the SLO each set
    with prefect_test_harness(), \
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        request = TINY.model_copy(update={"out": str(tmp_path / "flow.json"),
                                          "dask_scheduler": cluster.scheduler_address})
        fields = paper_figures(request)
        with get_client(sync_client=True) as client:
            sims = [r for r in client.read_task_runs() if r.task_key.startswith("simulate")]
    assert len(sims) == sum(batches) == 8
    assert sorted(r.name for r in sims) == sorted(
        ["fixed, 8 rollout GPUs", "fixed, 16 rollout GPUs"]
        + [f"DAPO {share:.0%} valid: {c}" for share in (0.3, 0.5, 0.8) for c in ("fixed", "ROSE")])
    assert fields["fig7_dapo"] and all(d["rose"]["slo_ttft_s"] == d["fixed"]["slo_ttft_s"]
                                       for d in fields["fig7_dapo"])
    assert _untimed(fields) == _untimed(local)
    written = json.loads((tmp_path / "flow.json").read_text())  # the figures' JSON, written by the flow
    assert _untimed(written["fig7_dapo"]) == _untimed(json.loads((tmp_path / "local.json").read_text())["fig7_dapo"])
