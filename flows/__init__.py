"""The Prefect flows people run and deploy: `train` (a run of N steps), `rl_step` (one step:
rollout -> reward -> train -> publish), the one-step off-policy gates (pipeline.py), the serving
trace replay, the cluster-simulation sweep, the paper figures and the benchmark flows. Flows may import tasks,
coordination, replay, executors, storage, dashboards, sim, core and envs; never rose (only
rose's launcher imports flows).
"""
