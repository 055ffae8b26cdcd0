"""The GIL bench (bench/transfer/transfer_gil.py) reads py-spy's raw stacks (tests/pyspy_stacks.py) into
GIL-held samples per function and per line (a function counted once per stack, however deep
it recurses)."""
from __future__ import annotations

from tests.pyspy_stacks import holders


def test_stacks_are_counted_per_function_and_leaf_line(tmp_path):
    raw = tmp_path / "gil.txt"
    raw.write_text(
        "thread (1): rose-codec_0;_worker (concurrent/futures/thread.py:93);"
        "_choose (storage/delta/payload.py:120);encode_ef (storage/delta/encodings.py:104) 7\n"
        "thread (2): MainThread;<module> (x.py:1);f (x.py:5);f (x.py:5) 3\n")
    total, inclusive, leaves = holders(raw)
    assert total == 10
    assert inclusive["_choose"] == 7 and inclusive["f"] == 3  # recursion: once per stack
    assert "thread (1): rose-codec_0" not in inclusive
    assert leaves == {"encode_ef (encodings.py:104)": 7, "f (x.py:5)": 3}

