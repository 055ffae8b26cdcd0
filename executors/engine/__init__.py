"""The in-process vLLM engine, and the only package that imports vLLM: the engine-owner thread
(owner.py), the rollout worker's engine loop, build and weight reload/read (vllm_engine.py), the
budgeted scheduler that caps tokens and KV blocks per step (budgeted_scheduler.py), request
submission (submit.py), the read-only view of the weights an engine computes with
(weights_view.py), the import of vLLM ahead of the first engine and the wait for it
(preload.py), and, for GPU machines without vLLM, a plain-PyTorch step timer of a model's
architecture (hf_timer.py, used by bench/engine_profile.py and bench/train_profile.py).
May import executors.policies and executors.turns; never Dask, Prefect or
the higher executors layers.
"""
