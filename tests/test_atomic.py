from __future__ import annotations

import pytest

from storage.atomic import atomic_path, is_temp, write_atomic


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.json"
    write_atomic(path, "old")
    write_atomic(path, b"new", fsync=True)
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "f"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            assert is_temp(tmp.name) and tmp.parent == tmp_path
            tmp.write_text("half")
            raise RuntimeError("writer died")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]
