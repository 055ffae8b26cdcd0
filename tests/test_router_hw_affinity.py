"""Hardware affinity in the turn router: the preferred device class first, any class once it is
saturated, and a mapping naming a class no worker has refused with the tags and classes."""
import pytest

from executors.policies.hw_affinity import STANDARD_CLASS, AffinityError, HwAffinity
from executors.policies.router import TurnRouter, WorkerInfo

AFFINITY = HwAffinity({"frozenlake": "compute", "default": "bandwidth"})


def make(cap: int = 2, affinity: HwAffinity | None = AFFINITY, serving: int = 0) -> TurnRouter:
    router = TurnRouter(cap_per_rollout_worker=cap, affinity=affinity)
    router.register_worker(WorkerInfo("h800-0", "rollout", "compute"))
    for i in range(2):
        router.register_worker(WorkerInfo(f"h20-{i}", "rollout", "bandwidth"))
    for i in range(serving):
        router.register_worker(WorkerInfo(f"serving-{i}", "serving"))
    return router


def place(router: TurnRouter, tid: str, tag: str | None, admits=None) -> str | None:
    worker = router.route(tid, admits, tag)
    if worker is not None:
        router.on_turn_start(tid, worker)
    return worker


def test_preferred_class_then_any_when_saturated():
    router = make(cap=2)
    # frozenlake prefers compute although the bandwidth workers are as idle (and listed later)
    assert place(router, "f0", "frozenlake") == "h800-0"
    assert place(router, "f1", "frozenlake") == "h800-0"
    # the compute worker is at its cap: the next frozenlake turn falls back to the least-loaded of any class
    assert place(router, "f2", "frozenlake") in ("h20-0", "h20-1")
    # untagged and unnamed tags take the default's class
    assert place(router, "g0", "guess") in ("h20-0", "h20-1")
    assert place(router, "n0", None) in ("h20-0", "h20-1")
    assert place(router, "n1", None) in ("h20-0", "h20-1")
    assert place(router, "n2", None) is None  # every worker at its cap: queue it
    # a slot on the compute worker frees up: the next frozenlake turn goes back to it
    router.on_turn_end("f0", "h800-0")
    router.forget("f0")
    assert router.route("f3", None, "frozenlake") == "h800-0"


def test_bandwidth_tags_fall_back_onto_compute():
    router = make(cap=1)
    assert {place(router, f"m{i}", "math") for i in range(2)} == {"h20-0", "h20-1"}
    assert place(router, "m2", "math") == "h800-0"


def test_cache_affinity_still_wins_over_class():
    router = make(cap=2)
    place(router, "f0", "frozenlake")
    place(router, "f1", "frozenlake")
    fell_back = place(router, "f2", "frozenlake")
    router.on_turn_end("f2", fell_back)
    router.on_turn_end("f0", "h800-0")
    # f2's prefix KV is on the bandwidth worker that served it: its next turn stays there
    assert router.route("f2", None, "frozenlake") == fell_back


def test_serving_workers_only_after_every_rollout_class():
    router = make(cap=1, serving=1)
    yes = lambda _: True  # noqa: E731
    assert place(router, "f0", "frozenlake", yes) == "h800-0"
    assert place(router, "f1", "frozenlake", yes).startswith("h20-")
    assert place(router, "f2", "frozenlake", yes).startswith("h20-")
    assert place(router, "f3", "frozenlake", yes) == "serving-0"


def test_removed_worker_leaves_its_class():
    router = make(cap=2)
    place(router, "f0", "frozenlake")
    assert router.remove_worker("h800-0") == ["f0"]
    assert router.route("f0", None, "frozenlake") in ("h20-0", "h20-1")
    router.register_worker(WorkerInfo("h800-0", "rollout", "compute"))
    assert router.route("f0", None, "frozenlake") == "h800-0"


def test_no_affinity_is_plain_least_loaded():
    router = make(cap=4, affinity=None)
    names = [place(router, f"t{i}", "frozenlake") for i in range(3)]
    assert sorted(names) == ["h20-0", "h20-1", "h800-0"]  # spread: no class preferred
    assert WorkerInfo("w", "rollout").device_class == STANDARD_CLASS


def test_unknown_class_is_refused_with_tags_and_classes():
    AFFINITY.check(["compute", "bandwidth", "compute"])
    with pytest.raises(AffinityError) as e:
        HwAffinity({"frozenlake": "compute", "guess": "tpu", "default": "bandwidth"}).check(["bandwidth", "standard"])
    msg = str(e.value)
    assert "\n" not in msg
    assert "frozenlake -> compute" in msg and "guess -> tpu" in msg and "default" not in msg.split(";")[0]
    assert "bandwidth, standard" in msg
    with pytest.raises(ValueError, match="empty"):
        HwAffinity({"frozenlake": ""})
    with pytest.raises(ValueError, match="device_class"):
        WorkerInfo("w", "rollout", "")
