"""Where phases run: Dask workers by kind, read from their resources (train/rollout/serving)."""
from __future__ import annotations

from distributed import Client

from rose.worker_kinds import KIND_OF_RESOURCE


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


def require(workers: dict[str, str], kind: str) -> list[str]:
    """Names of workers of `kind`; a clear error instead of a task pending forever."""
    names = sorted(n for n, k in workers.items() if k == kind)
    if not names:
        raise RuntimeError(f"no {kind} worker is connected to the Dask scheduler "
                           f"(have: {workers or 'none'}); start one with `rose up`")
    return names
