"""The step's transfer record (storage/weights/transfer_metrics.py) keeps which workers the
publish went on without and why; a run's files written before those columns existed still
read, through the catalog's `transfer` view, beside the new ones."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from storage.catalog import connect
from storage.weights.transfer_metrics import SCHEMA, transfer_path, write_transfer_metrics

SUMMARY = {"version": 3, "kind": "delta", "base_version": 2, "encoded_bytes": 10, "push_s": 0.1,
           "publish_s": 0.2, "workers_synced": 1}
ROW = {"name": "w", "layer": 0, "numel": 4, "changed": 1, "density": 0.25, "encoding": "ef",
       "raw_bytes": 8, "encoded_bytes": 10, "encode_s": 0.01}


def test_left_out_and_skipped_workers_are_recorded_with_why(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    write_transfer_metrics(run_dir, 3, {**SUMMARY, "left_out": {"serving-0": "restarting"},
                                        "skipped": {"trainer-0": "no rollout engine",
                                                    "rollout-1": "RelayError: cannot start"}},
                           [ROW])
    # every worker waited; the tensors were chosen for a 2.5 Gbps link (measured or configured)
    # ... at a host that codes Elias-Fano 2x as fast as the fitted costs and applies it 3x
    write_transfer_metrics(run_dir, 4, {**SUMMARY, "version": 4, "link_gbps": 2.5,
                                        "cpu_speed": {"ef": [2.0, 3.0]}, "coders": 8}, [ROW])
    # a file from before the columns existed
    old = pa.Table.from_pylist([{**{k: None for k in SCHEMA.names}, "step": 2, "version": 2,
                                 **ROW}], schema=SCHEMA).drop_columns(
        ["workers_left_out", "workers_skipped", "link_gbps", "cpu_speed", "coders"])
    pq.write_table(old, transfer_path(run_dir, 2))
    rows = connect(tmp_path).execute(
        "SELECT step, workers_left_out, workers_skipped, link_gbps FROM transfer "
        "ORDER BY step").fetchall()
    assert rows == [(2, None, None, None), (3, "serving-0: restarting",
                                            "rollout-1: RelayError: cannot start; "
                                            "trainer-0: no rollout engine", None), (4, "", "", 2.5)]
    speed = connect(tmp_path).execute(
        "SELECT step, cpu_speed->>'$.ef[1]' FROM transfer ORDER BY step").fetchall()
    assert speed == [(2, None), (3, None), (4, "3.0")]
    # coded on 8 coder processes at step 4, on the trainer's threads at 3 (none said: 0)
    coders = connect(tmp_path).execute("SELECT step, coders FROM transfer ORDER BY step").fetchall()
    assert coders == [(2, None), (3, 0), (4, 8)]


def test_the_empty_view_has_the_records_columns(tmp_path):
    """Before any publish the view is an empty table whose columns are spelled out by hand in
    storage/catalog.py (it cannot import the schema: torch); they must stay the schema's."""
    cols = [r[0] for r in connect(tmp_path).execute("DESCRIBE transfer").fetchall()]
    assert cols == ["run", *SCHEMA.names]
