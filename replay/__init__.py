"""Replaying a serving trace against serving endpoints: the replayer (replayer.py), the replay job
`rose serve replay` and the serving-replay flow run (job.py), and serving users' traffic in the
background of a training run (background.py). Imports executors, storage and core; never tasks,
flows or rose.
"""
