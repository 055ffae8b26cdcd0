"""What people look at: the terminal live view (progress.py) fed by an in-process event bus
(events.py), Prefect artifacts per step (artifacts.py), and the browser dashboards (web/, a Bokeh
server) drawn from the recorded datasets through storage.catalog. Dashboards only read and show:
they import storage, never executors, tasks, flows, Dask, vLLM or torch (lint-imports checks it).
"""
