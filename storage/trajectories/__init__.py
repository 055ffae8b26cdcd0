"""The trajectory dataset: one Arrow/Parquet partition per run and step (dataset.py), its schema
(schema.py) and the analyst queries run by DuckDB (queries.py). Imports nothing else of storage
but atomic.py.
"""
