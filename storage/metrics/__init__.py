"""Per-step metrics of training runs, for dashboards and analysts: the step table and the serving
table as Arrow/Parquet (schema.py, store.py), the same numbers as TensorBoard events
(tensorboard.py), both written at each step's end by record.py. Imports nothing else of storage
but atomic.py.
"""
