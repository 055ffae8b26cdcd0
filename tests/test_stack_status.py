"""`rose status`'s rendering of what runs hold (rose/stack/status.py): the run a serving worker is
lent to (its lease, coordination/serving_leases.py) beside its rollout engine's park state, and the
co-execution groups (coordination/coexec_groups.py) with the run holding each pool's permit."""
from __future__ import annotations

from rich.console import Console

from executors.policies.borrow import BorrowPolicy, ServingLoad
from executors.policies.coexec_group import ROLLOUT, TRAIN, PoolLimits, RunProfile
from coordination.coexec_groups import CoexecGroups
from coordination.serving_leases import ServingLeases
from rose.stack.status import coexec_table, rollout_cell

PARK = {"parked": False, "wake_s": 3.94, "pages_given_back": 120, "bytes_given_back": 300 * 2**20}


def text(renderable) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_a_serving_workers_cell_names_the_run_its_lease_lends_it_to(tmp_path):
    leases = ServingLeases(tmp_path)
    assert leases.holders() == {}  # no run has borrowed yet: no lease file
    leases.grant("run-a", [ServingLoad("serving-0", 0.1), ServingLoad("serving-1", 0.5)], BorrowPolicy(1))
    holders = leases.holders()
    assert holders == {"serving-0": "run-a"}
    assert rollout_cell(PARK, holders.get("serving-0")) == "up, lent to run run-a (woke in 3.9 s)"
    assert rollout_cell({**PARK, "parked": True}, holders.get("serving-1")) == \
        "[yellow]parked[/] (gave back 120 pages, 300 MiB)"
    assert rollout_cell(None, "run-a") == "-"  # no co-serving executor there
    leases.release("run-a")
    assert leases.holders() == {}


def test_the_groups_table_shows_each_groups_runs_and_who_holds_each_pool(tmp_path):
    groups = CoexecGroups(tmp_path)
    assert groups.pools() == {} and coexec_table(groups.pools()) is None  # no group: no table
    room = PoolLimits(2**40, 2**40)
    for run in ("a", "b"):
        groups.join("g", RunProfile(run, 10.0, 10.0, 2**30, 2**30, slo_factor=1.5), room)
    assert groups.take_turn("g", ROLLOUT, "a")  # a rolls out; the trainer pool is free, a's turn
    pools = groups.pools()
    assert pools == {"g": {"runs": ["a", "b"], "pools": {ROLLOUT: {"held_by": "a", "next": "b"},
                                                         TRAIN: {"held_by": None, "next": "a"}}}}
    row = next(line for line in text(coexec_table(pools)).splitlines() if line.lstrip("│ ").startswith("g "))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == ["g", "a, b", "a", "free, a's turn"]
