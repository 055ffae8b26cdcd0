"""The whole stack as in a container with a small /dev/shm (Docker's and Kubernetes' default is
64 MB): `rose up` and `rose train` with coder processes on, inside a mount namespace whose
/dev/shm is a 2 MiB tmpfs (unshare -Urm; the real limit, not a mock). The trainer's snapshots
do not fit there: the run trains, its deltas coded on the trainer's threads (the transfer
record's `coders` is 0), and the trainer's log says why once. Before arenas reserved their
memory the trainer died of SIGBUS at its first snapshot."""
from __future__ import annotations

import sys

import pytest

from storage.catalog import connect
from tests.small_shm import run_in_small_shm
from tests.stack_fixtures import cli_stack_env, new_data_dir

pytestmark = [pytest.mark.slow, pytest.mark.models]


def test_a_run_trains_in_a_2_mib_shm_coding_on_threads(tmp_path_factory):
    data = new_data_dir(tmp_path_factory, "rose-small-shm")
    cfg = data / "run.yaml"
    cfg.write_text("run_id: small-shm\nsteps: 1\n"
                   "rollout: {groups: 2, group_size: 4, max_turns: 3}\n"  # the publish is what is tested
                   "publish: {coder_processes: 2, link_gbps: 0.05, measure_link: false}\n")
    rose = f"{sys.executable} -m rose.cli"
    with cli_stack_env(data) as env:  # stops the stack from outside the namespace afterwards
        run = run_in_small_shm(f"{rose} up --rollout-workers 1 && {rose} train -c {cfg}", "2m",
                               env, timeout=1200)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    coders = connect(data).execute(
        "SELECT step, kind, any_value(coders) FROM transfer WHERE run = 'small-shm' "
        "GROUP BY ALL ORDER BY step").fetchall()
    assert coders == [(0, "full", 0), (1, "delta", 0)]  # coded on the trainer's threads
    log = (data / "stack" / "logs" / "worker-trainer-0.log").read_text()
    assert log.count("does not fit") == 1 and "/dev/shm has" in log
