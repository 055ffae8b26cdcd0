"""The background puller keeps every request: one that arrives while a pull fails is retried,
not dropped with the failure (executors/workers/weight_sync.PullAgent)."""
import threading

import pytest

from executors.workers.weight_sync import PullAgent


class Report:
    def __init__(self, version):
        self.version, self.mode = version, "full"

    def as_dict(self):
        return {"version": self.version, "mode": self.mode}


class FlakyReceiver:
    """The first pull blocks until released, then fails; later pulls succeed."""
    run, digest, tensors = "r", "d", {}

    def __init__(self):
        self.release, self.started, self.calls = threading.Event(), threading.Event(), []

    def pull(self, version, accept_newer=True):
        self.calls.append(version)
        if len(self.calls) == 1:
            self.started.set()
            self.release.wait(10)
            raise ConnectionError("relay went away")
        return Report(version)


def loader(version, tensors):
    return {"version": version}


def test_a_request_during_a_failed_pull_is_retried_not_lost():
    receiver = FlakyReceiver()
    agent = PullAgent(receiver, loader, "w")
    agent.request(1)
    assert receiver.started.wait(10)
    agent.request(2)  # arrives while the pull of v1 is failing
    receiver.release.set()
    assert agent.wait(2, timeout=10)["version"] == 2
    assert receiver.calls == [1, 2] and agent.loaded == 2 and agent.error == ""


def test_a_failed_pull_with_nothing_newer_reports_its_error():
    receiver = FlakyReceiver()
    agent = PullAgent(receiver, loader, "w")
    agent.request(1)
    receiver.release.set()
    with pytest.raises(RuntimeError, match="relay went away"):
        agent.wait(1, timeout=10)
    agent.request(1)  # the next request retries
    assert agent.wait(1, timeout=10)["version"] == 1


class HostCopy:
    """A receiver of one run: pulls always succeed; noop once it holds the version."""

    def __init__(self, run):
        self.run, self.digest, self.version, self.calls = run, f"d-{run}", None, []
        self.tensors = {"w": run}

    def pull(self, version, accept_newer=True):
        self.calls.append(version)
        report = Report(version)
        report.mode = "noop" if self.version == version else "full"
        self.version = version
        return report


def test_two_runs_on_one_engine_stay_apart():
    """Each run keeps its host copy; the engine holds one run's weights; another run's publish
    waits in its host copy until that run claims the engine (a load, no pull)."""
    from executors.workers.weight_sync import EngineHolder

    engine: list[tuple[str, int]] = []  # what the engine was handed: (run, version)
    holder = EngineHolder()

    def agent_of(run):
        return PullAgent(HostCopy(run), lambda v, t: engine.append((t["w"], v)) or {}, "w", holder)
    a, b = agent_of("a"), agent_of("b")
    a.request(1)
    assert not a.wait(1, 10)["deferred"] and engine == [("a", 1)]
    b.request(1)  # b's publish while a's weights are in the engine: host copy only
    record = b.wait(1, 10)
    assert record["deferred"] and record["engine_run"] == "a" and engine == [("a", 1)]
    assert b.held == 1 and b.loaded is None and holder.run == "a"
    b.request(1, claim=True)  # b's rollout: loads its held copy, pulls nothing new
    record = b.wait(1, 10)
    assert record["switched"] and record["mode"] == "noop" and engine[-1] == ("b", 1)
    a.request(2)  # a's next publish: deferred, b holds the engine
    assert a.wait(2, 10)["deferred"] and engine[-1] == ("b", 1)
    a.request(2, claim=True)
    assert not a.wait(2, 10)["deferred"] and engine[-1] == ("a", 2) and holder.switches == 2
    a.request(2, claim=True)  # claimed again with the engine already on a's v2: nothing loads
    a.wait(2, 10)
    assert len(engine) == 3 and a.receiver.calls == [1, 2, 2, 2] and b.receiver.calls == [1, 1]
