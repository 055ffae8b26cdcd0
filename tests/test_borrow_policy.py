"""The borrowing policy (executors/policies/borrow.py) and the stack's serving leases
(coordination/serving_leases.py): choice by serving load, one run per worker, cap, expiry,
release, and the note a run's step summary carries."""
from __future__ import annotations

import json
import time

import pytest

from executors.policies.borrow import BorrowPolicy, LeaseTable, ServingLoad
from coordination.serving_leases import LEASES_FILE, ServingLeases, borrowing

ALL = BorrowPolicy()


def loads(**pressure: float) -> list[ServingLoad]:
    return [ServingLoad(w, kv) for w, kv in pressure.items()]


def test_lowest_serving_load_first_up_to_the_cap():
    table = LeaseTable()
    grant = table.grant("a", loads(s0=0.7, s1=0.1, s2=0.4), BorrowPolicy(max_serving_workers=2), now=0)
    assert grant.workers == ["s1", "s2"] and grant.note == ""
    assert table.held_by("a") == ["s1", "s2"]


def test_ttft_slack_counts_as_load():
    busy = ServingLoad("s0", kv_used=0.1, ttft_p99_s=0.9, slo_ttft_s=1.0)  # 10% slack left
    idle = ServingLoad("s1", kv_used=0.3, ttft_p99_s=0.1, slo_ttft_s=1.0)
    assert busy.pressure == pytest.approx(0.9) and idle.pressure == pytest.approx(0.3)
    assert LeaseTable().grant("a", [busy, idle], BorrowPolicy(1), now=0).workers == ["s1"]
    assert ServingLoad("s2", 0.2).pressure == 0.2  # no request served yet: KV use alone


def test_rechosen_each_step_by_the_load_then():
    table = LeaseTable()
    assert table.grant("a", loads(s0=0.1, s1=0.5), BorrowPolicy(1), now=0).workers == ["s0"]
    step2 = table.grant("a", loads(s0=0.9, s1=0.5), BorrowPolicy(1), now=10)
    assert step2.workers == ["s1"] and step2.fresh == ["s1"]  # s1 missed the run's publishes
    assert table.held_by("a") == ["s1"]  # s0 went back to serving alone
    step3 = table.grant("a", loads(s0=0.9, s1=0.5), BorrowPolicy(1), now=20)
    assert step3.workers == ["s1"] and step3.fresh == []
    assert table.leases["s1"].since == 10 and table.leases["s1"].renewed == 20


def test_a_worker_is_lent_to_one_run_a_second_run_gets_the_others_and_says_so():
    table = LeaseTable()
    table.grant("a", loads(s0=0.1), ALL, now=0)
    b = table.grant("b", loads(s0=0.1, s1=0.6), ALL, now=1)
    assert b.workers == ["s1"] and b.held_elsewhere == {"s0": "a"}
    assert "s0 (run a)" in b.note and "borrowed the others: s1" in b.note
    c = table.grant("c", loads(s0=0.1, s1=0.6), ALL, now=2)
    assert c.workers == [] and c.held_elsewhere == {"s0": "a", "s1": "b"}
    assert c.note.endswith("borrowed none")
    assert table.held_by("a") == ["s0"] and table.held_by("b") == ["s1"]


def test_asking_for_more_than_exist_gets_what_there_is_and_says_so():
    grant = LeaseTable().grant("a", loads(s0=0.1), BorrowPolicy(max_serving_workers=4), now=0)
    assert grant.workers == ["s0"]
    assert grant.note == "asked for 4 serving workers, 1 exist: borrowing what there is"


def test_a_lease_not_renewed_lapses_and_the_worker_goes_to_the_next_run():
    table = LeaseTable()
    table.grant("a", loads(s0=0.1), BorrowPolicy(ttl_s=30), now=0)
    assert table.grant("b", loads(s0=0.1), ALL, now=29).workers == []
    assert table.renew("a", now=25) == ["s0"]
    assert table.grant("b", loads(s0=0.1), ALL, now=50).workers == []  # renewed at 25: till 55
    late = table.grant("b", loads(s0=0.1), ALL, now=56)
    assert late.workers == ["s0"] and late.expired == {"s0": "a"}


def test_release_frees_the_runs_workers_only():
    table = LeaseTable()
    table.grant("a", loads(s0=0.1), ALL, now=0)
    table.grant("b", loads(s0=0.1, s1=0.2), ALL, now=0)
    assert table.release("a") == {"s0": "a"}
    assert table.held_by("a") == [] and table.held_by("b") == ["s1"]
    assert table.release() == {"s1": "b"} and table.leases == {}


def test_a_worker_given_back_leaves_the_grant_with_the_reason():
    table = LeaseTable()
    grant = table.grant("a", loads(s0=0.1, s1=0.2), ALL, now=0)
    assert table.release("a", ["s1"]) == {"s1": "a"} and table.held_by("a") == ["s0"]
    less = grant.without({"s1": "could not load v3"})
    assert less.workers == ["s0"] and less.fresh == ["s0"]
    assert less.note == "s1 given back: could not load v3"


def test_unmeasured_workers_are_chosen_last():
    grant = LeaseTable().grant("a", [ServingLoad.unknown("s0"), ServingLoad("s1", 0.95)], BorrowPolicy(1), now=0)
    assert grant.workers == ["s1"]


@pytest.mark.parametrize("bad", [{"max_serving_workers": 0}, {"ttl_s": 0}, {"ttl_s": float("nan")}])
def test_policy_refuses_bad_settings(bad):
    with pytest.raises(ValueError):
        BorrowPolicy(**bad)


def test_run_config_refuses_a_cap_below_one_in_one_line():
    from pydantic import ValidationError

    from core.config import RunConfig

    assert RunConfig(borrow={"max_serving_workers": 2}).borrow.max_serving_workers == 2
    with pytest.raises(ValidationError, match="must be >= 1 or unset") as e:
        RunConfig(borrow={"max_serving_workers": 0})
    assert "rollout.borrow_serving: false" in str(e.value)


# ---- the stack's lease file, shared by every run's driver ----------------------------------------
def test_the_lease_file_is_one_table_for_every_driver(tmp_path):
    a, b = ServingLeases(tmp_path), ServingLeases(tmp_path)  # two drivers' views
    assert a.grant("a", loads(s0=0.1, s1=0.5), BorrowPolicy(1)).workers == ["s0"]
    assert b.grant("b", loads(s0=0.1, s1=0.5), ALL).workers == ["s1"]
    assert b.held_by("a") == ["s0"]
    assert json.loads((tmp_path / LEASES_FILE).read_text())["leases"]["s0"]["run"] == "a"
    assert a.give_back("a", ["s0"]) == {"s0": "a"} and a.held_by("a") == []


def test_held_by_leaves_out_lapsed_leases(tmp_path):
    leases = ServingLeases(tmp_path)
    leases.grant("a", loads(s0=0.1), BorrowPolicy(ttl_s=0.05))
    time.sleep(0.1)
    assert leases.held_by("a") == []


def test_borrowing_renews_while_the_run_drives_and_releases_at_its_end(tmp_path):
    leases = ServingLeases(tmp_path)
    def renewed() -> float:
        return json.loads((tmp_path / LEASES_FILE).read_text())["leases"]["s0"]["renewed"]

    with borrowing(leases, "a", ttl_s=0.04):  # renews every 10 ms
        leases.grant("a", loads(s0=0.1), BorrowPolicy(ttl_s=60))
        granted = renewed()
        deadline = time.monotonic() + 30
        while renewed() == granted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert renewed() > granted
    assert leases.held_by("a") == []


def test_borrowing_releases_when_the_run_fails(tmp_path):
    leases = ServingLeases(tmp_path)
    with pytest.raises(RuntimeError), borrowing(leases, "a", ttl_s=60):
        leases.grant("a", loads(s0=0.1), ALL)
        raise RuntimeError("step failed")
    assert ServingLeases(tmp_path).grant("b", loads(s0=0.1), ALL).workers == ["s0"]


def test_release_of_every_lease_as_rose_down_does(tmp_path):
    leases = ServingLeases(tmp_path)
    assert leases.release() == {}  # no table yet: nothing written
    assert not (tmp_path / LEASES_FILE).exists()
    leases.grant("a", loads(s0=0.1), ALL)
    leases.grant("b", loads(s0=0.1, s1=0.1), ALL)
    assert leases.release() == {"s0": "a", "s1": "b"}
    assert leases.held_by("a") == leases.held_by("b") == []


def test_an_unreadable_lease_file_starts_afresh(tmp_path):
    (tmp_path / LEASES_FILE).write_text("{not json")
    assert ServingLeases(tmp_path).grant("a", loads(s0=0.1), ALL).workers == ["s0"]


# ---- the rollout task's side (tasks/borrow.py), against a stand-in Dask client -------------------
class Done:
    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def result(self, timeout=None):
        return self.fn(*self.args, **self.kwargs)


class FakeClient:
    """Workers serving-0/1 (serving-1 busier); each call runs the stand-in function at once."""

    def __init__(self, kv: dict[str, float], sync_fails: tuple[str, ...] = (), parked: tuple[str, ...] = ()) -> None:
        self.kv, self.sync_fails, self.synced, self.parked = kv, sync_fails, [], set(parked)

    def scheduler_info(self, n_workers=-1):
        return {"workers": {f"tcp://{n}": {"name": n, "status": "running"} for n in self.kv}}

    def submit(self, fn, *args, workers, allow_other_workers, pure, **kwargs):
        worker = workers[0].removeprefix("tcp://")
        if fn.__name__ == "coserving_load":
            return Done(lambda: {"worker": worker, "kv_used": self.kv[worker], "ttft_p99_s": None,
                                 "slo_ttft_s": 0.5, "parked": worker in self.parked}, (), {})

        def sync(*a, **k):
            if worker in self.sync_fails:
                raise TimeoutError("v1 not loaded within 120 s")
            self.synced.append((worker, a[2]))
            return {}
        return Done(sync, args, kwargs)


def test_a_step_borrows_by_load_and_a_fresh_worker_loads_the_runs_version(tmp_path, monkeypatch):
    from core.config import RunConfig
    from tasks.borrow import borrow_for_step, stack_leases

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    client = FakeClient({"serving-0": 0.6, "serving-1": 0.2})
    a = RunConfig(run_id="a", borrow={"max_serving_workers": 1})
    grant = borrow_for_step(client, a, ["serving-0", "serving-1"], version=3)
    assert grant.workers == ["serving-1"] and client.synced == [("serving-1", 3)]
    assert borrow_for_step(client, a, ["serving-0", "serving-1"], version=4).fresh == []
    assert client.synced == [("serving-1", 3)]  # held since the last step: its publishes reached it
    b = borrow_for_step(client, RunConfig(run_id="b"), ["serving-0", "serving-1"], version=1)
    assert b.workers == ["serving-0"] and b.held_elsewhere == {"serving-1": "a"}
    assert stack_leases().held_by("a") == ["serving-1"] and stack_leases().held_by("b") == ["serving-0"]


def test_a_held_worker_found_parked_loads_the_runs_version_again(tmp_path, monkeypatch):
    """A serving worker restarted between steps comes up parked: the run holding it claims it
    again (its weight sync wakes the engine), or it would sit out the run unused."""
    from core.config import RunConfig
    from tasks.borrow import borrow_for_step

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    client = FakeClient({"serving-0": 0.1})
    a = RunConfig(run_id="a")
    assert borrow_for_step(client, a, ["serving-0"], version=1).fresh == ["serving-0"]
    client.parked.add("serving-0")
    grant = borrow_for_step(client, a, ["serving-0"], version=2)
    assert grant.workers == ["serving-0"] and grant.fresh == []
    assert client.synced == [("serving-0", 1), ("serving-0", 2)]


def test_a_step_asking_for_more_serving_workers_than_exist_says_so_in_its_summary(tmp_path, monkeypatch):
    from core.config import RunConfig
    from tasks.borrow import borrow_for_step

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    client = FakeClient({"serving-0": 0.1})
    grant = borrow_for_step(client, RunConfig(run_id="a", borrow={"max_serving_workers": 3}), ["serving-0"], 1)
    assert grant.as_dict()["workers"] == ["serving-0"]
    assert grant.as_dict()["note"] == "asked for 3 serving workers, 1 exist: borrowing what there is"


def test_a_fresh_worker_that_cannot_load_the_version_is_given_back(tmp_path, monkeypatch):
    from core.config import RunConfig
    from tasks.borrow import borrow_for_step, stack_leases

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    client = FakeClient({"serving-0": 0.1, "serving-1": 0.2}, sync_fails=("serving-0",))
    grant = borrow_for_step(client, RunConfig(run_id="a"), ["serving-0", "serving-1"], version=1)
    assert grant.workers == ["serving-1"] and "serving-0" in grant.dropped
    assert "serving-0 given back: could not load v1" in grant.as_dict()["note"]
    assert stack_leases().held_by("a") == ["serving-1"]


def test_the_step_summary_markdown_says_what_was_borrowed_and_why_not_more():
    from dashboards.artifacts import step_markdown

    table = LeaseTable()
    table.grant("a", loads(s0=0.1), ALL, now=0)
    grant = table.grant("b", loads(s0=0.1, s1=0.2), ALL, now=0)
    md = step_markdown("b", {"step": 1, "borrow": grant.as_dict()})
    assert "**borrowed serving workers** s1 (held by other runs: s0 (run a);" in md
    assert "borrowed serving" not in step_markdown("b", {"step": 1})
