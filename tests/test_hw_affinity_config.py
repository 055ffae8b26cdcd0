"""Hardware affinity's configuration: rollout.hw_affinity and stack.rollout_device_classes are
validated, a rollout worker advertises its class as a Dask resource, and a run whose mapping
names a class no rollout worker has is refused at its start with the tags and classes listed."""
import pytest
from pydantic import ValidationError

from executors.policies.hw_affinity import AffinityError
from core.config import RolloutConfig, RunConfig, StackConfig
from rose.stack.dask_cluster import worker_command, worker_specs
from tasks.placement import check_hw_affinity, device_classes, workers_by_kind


class FakeClient:
    """scheduler_info as distributed answers it, for workers with these resources."""

    def __init__(self, workers: dict[str, dict[str, float]]) -> None:
        self.workers = workers

    def scheduler_info(self, n_workers: int = -1) -> dict:
        return {"workers": {f"tcp://w{i}": {"name": name, "resources": res, "status": "running"}
                            for i, (name, res) in enumerate(self.workers.items())}}


def test_config_keys_are_validated():
    r = RolloutConfig(hw_affinity={"frozenlake": "compute", "default": "bandwidth"})
    assert r.hw_affinity["frozenlake"] == "compute"
    assert RolloutConfig().hw_affinity == {}  # unset: no preference, routing as before
    with pytest.raises(ValidationError, match="not environments"):
        RolloutConfig(hw_affinity={"frozenlak": "compute"})
    with pytest.raises(ValidationError, match="not class names"):
        RolloutConfig(hw_affinity={"frozenlake": "compute rich"})
    assert StackConfig(rollout_workers=2, rollout_device_classes=["compute", "bandwidth"])
    with pytest.raises(ValidationError, match="one per worker"):
        StackConfig(rollout_workers=2, rollout_device_classes=["compute"])
    with pytest.raises(ValidationError, match="not class names"):
        StackConfig(rollout_workers=1, rollout_device_classes=["a=b"])
    cfg = RunConfig.model_validate({"rollout": {"hw_affinity": {"guess": "bandwidth"}}})
    assert cfg.rollout.hw_affinity == {"guess": "bandwidth"}


def test_rollout_worker_advertises_its_class(tmp_path):
    specs = {s.name: s for s in worker_specs(1, 2, 1, ncores=2, rollout_classes=["compute", "bandwidth"])}
    assert specs["rollout-0"].resources == "rollout_gpu=1,hw_compute=1"
    assert specs["rollout-1"].resources == "rollout_gpu=1,hw_bandwidth=1"
    assert specs["serving-0"].resources == "serving_gpu=1"
    cmd = worker_command(specs["rollout-1"], "tcp://127.0.0.1:1", tmp_path)
    assert cmd[cmd.index("--resources") + 1] == "rollout_gpu=1,hw_bandwidth=1"
    # none configured: the worker carries only its kind's resource, as before
    assert {s.resources for s in worker_specs(0, 2, 0, ncores=2)} == {"rollout_gpu=1"}


def test_classes_read_back_and_a_missing_class_is_refused():
    client = FakeClient({"rollout-0": {"rollout_gpu": 1, "hw_compute": 1}, "rollout-1": {"rollout_gpu": 1},
                         "serving-0": {"serving_gpu": 1}, "trainer-0": {"train_gpu": 1}})
    assert workers_by_kind(client)["rollout-0"] == "rollout"  # the class resource is no kind
    assert device_classes(client) == {"rollout-0": "compute", "rollout-1": "standard"}
    check_hw_affinity(client, {"frozenlake": "compute", "default": "standard"})
    check_hw_affinity(client, {})
    with pytest.raises(AffinityError) as e:
        check_hw_affinity(client, {"frozenlake": "compute", "default": "bandwidth"})
    assert str(e.value) == ("rollout.hw_affinity maps default -> bandwidth, but no rollout worker has "
                            "that class; the workers' classes: compute, standard")


def test_scheduler_refuses_a_missing_class_before_touching_workers():
    from executors.scheduling.scheduler import RolloutScheduler

    workers = {"rollout-0": "rollout", "rollout-1": "rollout", "serving-0": "serving"}
    with pytest.raises(AffinityError, match="frozenlake -> compute.*classes: bandwidth, standard"):
        RolloutScheduler(None, workers, hw_affinity={"frozenlake": "compute"},
                         classes={"rollout-0": "bandwidth", "serving-0": "compute"})
