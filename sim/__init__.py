"""Cluster-scale discrete-event simulation of ROSE (issue 12), driving the project's policies unchanged.

Engines are replaced by latency models (executors/policies/latency_profile.py curves); the
router, load index, dual-SLO admission, step planning, KV memory policy and stall rule are the
very objects the workers run, imported from executors.policies.

May import: executors.policies (the plain-Python policies), core.trace (the serving
trace), storage.trajectories (to fit workloads from the Arrow data), storage.cores (a result's
header), numpy/pyarrow/duckdb.
Never: vLLM, torch, Dask (distributed), Prefect, Mooncake, web servers, or the executor layers
that wrap engines and networks (executors.engine/coserving/scheduling/workers). Checked by
import-linter (pyproject.toml). The staleness rule lives in executors.workers.weight_sync, which
imports torch and Dask, so sim/staleness.py mirrors it and a test pins the two together.
"""
