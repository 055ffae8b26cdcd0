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
