"""The chaos bench's quick faults as slow tests: each its own run of two small RL steps, in turn
on one local stack (Mooncake relay), with the fault injected from outside the product by the
chaos harness the bench runs too (tests/chaos_faults.py, tests/chaos_run.py), judged by its
reading of what the run left behind (tests/chaos_stack.py). The other faults, each on a fresh stack, stay in
`python -m bench.stack.chaos`.

    .venv/bin/pytest -m slow tests/test_chaos.py
"""
from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest
from rich.console import Console

from tests.stack_fixtures import shared_models

pytestmark = [pytest.mark.slow, pytest.mark.models]

# under a minute of training each on this 2-core machine. Fault 1 (a rollout worker's process
# killed, its nanny restarting it) and fault 2 (killed with its nanny, the stack's supervisor
# restarting it) both end in a fresh worker under the same name that rejoins or stays out:
# tests/test_fault_reroute.py checks that path turn by turn on fault 2; both stay in
# `python -m bench.stack.chaos`. 6 first: 1b leaves rollout-1's restart frozen for the stack's life.
QUICK = ["6", "1b"]


@pytest.fixture(scope="module")
def args(tmp_path_factory) -> Namespace:
    return Namespace(root=str(tmp_path_factory.mktemp("chaos")),
                     models=str(shared_models(tmp_path_factory)), steps=2, groups=2,
                     group_size=8, max_turns=6)  # 3+ turn batches: the faults strike at the 3rd


@pytest.fixture(scope="module")
def stack(args):
    """One stack for the quick faults' runs; `rose down` after the last must leave no process."""
    from tests.chaos_run import run_config
    from tests.chaos_faults import FAULTS
    from tests.chaos_stack import Bed

    shapes = [f.stack for f in FAULTS if f.key in QUICK]
    assert all(s == shapes[0] for s in shapes), shapes  # one stack fits every quick fault
    bed = Bed.fresh(Path(args.root), "quick", Path(args.models), run_config(args, shapes[0]))
    bed.up()
    yield bed
    down = bed.down()
    assert down.rc == 0, down.tail()  # `rose down` left no process behind


@pytest.mark.parametrize("key", QUICK)
def test_fault_recovered_with_nothing_lost(key, args, stack):
    from tests.chaos_run import run_fault
    from tests.chaos_faults import FAULTS

    [fault] = [f for f in FAULTS if f.key == key]
    row = run_fault(fault, args, Console(stderr=True), stack=stack)
    assert not row.get("hung"), f"fault {key} hung past its deadline: {row.get('tail')}"
    assert row["injected"] and not row["injected"].get("error"), row["injected"]
    assert row["recovered"], row
    assert row["trajectories_lost"] == 0 and row["duplicate_rows"] == 0
    assert row["weights_equal"] is True  # the final checkpoint = a replay of its trajectories
    assert row["weights_moved"]  # GRPO updated them: the comparison is not vacuous
