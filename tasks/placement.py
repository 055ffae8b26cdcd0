"""Where phases run: Dask workers by kind, read from their resources (train/rollout/serving)."""
from __future__ import annotations

from distributed import Client

from executors.policies.hw_affinity import STANDARD_CLASS, HwAffinity
from core.worker_kinds import CLASS_RESOURCE_PREFIX, KIND_OF_RESOURCE


def workers_by_kind(client: Client) -> dict[str, str]:
    """Worker name -> kind for every running worker that carries a ROSE resource. A worker
    whose nanny restarted it registers with status "init" until its plugins (the vLLM engine)
    are set up, and may stay there: a phase that counted it would wait on it forever."""
    out = {}
    for info in client.scheduler_info(n_workers=-1)["workers"].values():
        if info.get("status", "running") != "running":
            continue
        for resource in info.get("resources", {}):
            if resource in KIND_OF_RESOURCE:
                out[info["name"]] = KIND_OF_RESOURCE[resource]
    return out


def device_classes(client: Client) -> dict[str, str]:
    """Rollout worker name -> its device class: the resource hw_<class> it carries
    (stack.rollout_device_classes; on a cluster, its --resources), else the one standard class."""
    out = {}
    for info in client.scheduler_info(n_workers=-1)["workers"].values():
        resources = info.get("resources", {})
        if KIND_OF_RESOURCE.get(next((r for r in resources if r in KIND_OF_RESOURCE), "")) != "rollout":
            continue
        classes = [r.removeprefix(CLASS_RESOURCE_PREFIX) for r in resources if r.startswith(CLASS_RESOURCE_PREFIX)]
        out[info["name"]] = classes[0] if classes else STANDARD_CLASS
    return out


def check_hw_affinity(client: Client, mapping: dict[str, str]) -> None:
    """Refuse a hw_affinity naming a class no connected rollout worker has (AffinityError)."""
    if mapping:
        HwAffinity(mapping).check(device_classes(client).values())


def require(workers: dict[str, str], kind: str) -> list[str]:
    """Names of workers of `kind`; a clear error instead of a task pending forever."""
    names = sorted(n for n, k in workers.items() if k == kind)
    if not names:
        raise RuntimeError(f"no {kind} worker is connected to the Dask scheduler "
                           f"(have: {workers or 'none'}); start one with `rose up`")
    return names
