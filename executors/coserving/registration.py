"""Serving workers come up co-serving: the co-serving plugin registered on the stack's Dask
scheduler builds, on each worker of kind `serving`, the serving and rollout engines and opens
the worker's OpenAI-compatible endpoint (executors/coserving/plugin.py).

Registered once per scheduler (`rose up`, and again, idempotently, by `rose train`, so a
cluster scheduler given by address gets it too); Dask re-runs it on a worker that restarts or
joins later. The endpoints' URLs are recorded in the stack file for `rose status` and
`rose serve endpoints`.
"""
from __future__ import annotations

from distributed import Client

from executors.coserving.endpoint.api_keys import load_keys
from executors.coserving.plugin import (CoServingPlugin, serving_endpoint, serving_slo,
                                        set_serving_slo)
from executors.policies.slo_admission import SLOConfig
from core.config import ModelsConfig, StackConfig


def coserving_plugin(models: ModelsConfig, stack: StackConfig) -> CoServingPlugin:
    """The plugin every serving worker of this stack runs: its models, mode, SLO and the
    co-serving settings (stack.coserving); its rollout engine parked from the start
    unless stack.coserving.park_at_start is off."""
    slo = None
    if stack.serving_slo_ttft_s is not None and stack.serving_slo_tpot_s is not None:
        slo = SLOConfig(ttft_s=stack.serving_slo_ttft_s, tpot_s=stack.serving_slo_tpot_s)
    return CoServingPlugin(models.serving_path(), models.policy_path(), mode=stack.serving_mode,
                           slo=slo, api_keys=load_keys(stack.serving_api_keys_file),
                           start_parked=stack.coserving.park_at_start,
                           open_paths=tuple(stack.serving_open_paths), **stack.coserving.model_dump())


def serving_workers(client: Client) -> list[str]:
    info = client.scheduler_info(n_workers=-1)["workers"].values()
    return sorted(str(w["name"]) for w in info if "serving_gpu" in (w.get("resources") or {}))


def start_serving(client: Client, models: ModelsConfig, stack: StackConfig) -> dict[str, str]:
    """Register the co-serving plugin (a no-op when it already runs); serving worker -> URL."""
    if not serving_workers(client):
        return {}
    client.register_plugin(coserving_plugin(models, stack), name=CoServingPlugin.name)
    return endpoints(client)


def _by_name(client: Client, answers: dict) -> dict:
    """Client.run's answers (worker address -> answer) by worker name, the None ones left out."""
    names = {addr: str(w["name"]) for addr, w in client.scheduler_info(n_workers=-1)["workers"].items()}
    return {names[addr]: a for addr, a in answers.items() if a is not None and addr in names}


def endpoints(client: Client) -> dict[str, str]:
    """Serving worker name -> endpoint URL, for the workers whose endpoint is up."""
    return {name: url for name, url in _by_name(client, client.run(serving_endpoint)).items() if url}


def current_slo(client: Client) -> SLOConfig | None:
    """The loosest SLO the serving workers hold now (each derives its own from its profile)."""
    slos = [s for s in client.run(serving_slo).values() if s is not None]
    if not slos:
        return None
    return SLOConfig(max(s["ttft_s"] for s in slos), max(s["tpot_s"] for s in slos))


def hold_serving_slo(client: Client, slo: SLOConfig, source: str) -> dict[str, dict]:
    """Every serving worker holds admission and its endpoint to `slo` from now on (a run's
    derived SLO); serving worker -> the SLO it now reports."""
    return _by_name(client, client.run(set_serving_slo, slo.ttft_s, slo.tpot_s, source))
