"""The elastic rollout scheduler on the Dask client side: the dispatch loop that routes every turn
(scheduler.py), the worker pool and liveness, the cached view of serving workers' admission, the
episode state machine, group launch, and the rollout report. May import every lower executors
layer (workers, coserving, policies), storage, rose (chat templates) and envs; never tasks or
flows. vLLM only through executors.engine.
"""
