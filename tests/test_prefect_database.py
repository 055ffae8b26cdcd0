"""A new Prefect database starts as a copy of a migrated one; an existing one is kept."""
from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from rose.stack.prefect_database import database_path, save_template, seed_database, template_path


def _rows(db: Path, sql: str) -> list:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _wal_database(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")  # as Prefect's server opens it
    con.execute("CREATE TABLE alembic_version (version_num TEXT)")
    con.execute("INSERT INTO alembic_version VALUES ('v1')")
    con.commit()
    return con


def test_the_template_is_a_consistent_copy_of_a_database_being_written(tmp_path):
    db, template = tmp_path / "prefect.db", tmp_path / "cache" / "prefect-x.db"
    con = _wal_database(db)
    con.execute("CREATE TABLE run (n INTEGER)")
    con.commit()
    done = threading.Event()

    def write() -> None:  # the server goes on writing, a row a transaction
        n = 0
        while not done.is_set():
            con.execute("INSERT INTO run VALUES (?)", (n,))
            con.commit()
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        time.sleep(0.05)
        assert save_template(db, template)
    finally:
        done.set()
        writer.join()
    assert _rows(template, "SELECT * FROM alembic_version") == [("v1",)]
    [(count, top)] = _rows(template, "SELECT count(*), max(n) FROM run")
    assert count > 0 and count == top + 1  # a prefix of the writes, none half-applied
    assert not [p for p in template.parent.iterdir() if p != template]  # no temp file left


def test_a_new_database_is_seeded_and_an_existing_one_kept(tmp_path):
    template = tmp_path / "template.db"
    home = tmp_path / "home"
    home.mkdir()
    db = database_path(home)
    assert not seed_database(db, template) and not db.exists()  # no template yet: Prefect migrates
    _wal_database(template).close()
    assert seed_database(db, template)
    assert _rows(db, "SELECT * FROM alembic_version") == [("v1",)]
    con = sqlite3.connect(db)
    con.execute("UPDATE alembic_version SET version_num = 'mine'")
    con.commit()
    con.close()
    assert not seed_database(db, template)  # a restart keeps its runs
    assert _rows(db, "SELECT * FROM alembic_version") == [("mine",)]


def test_a_template_that_cannot_be_written_is_reported_not_raised(tmp_path, caplog):
    db = tmp_path / "prefect.db"
    _wal_database(db).close()
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory should be")
    assert not save_template(db, blocker / "rose" / "prefect-x.db")
    assert "could not keep the Prefect database template" in caplog.text


def test_the_template_is_per_prefect_version_in_the_users_cache(tmp_path, monkeypatch):
    from importlib.metadata import version

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert template_path() == tmp_path / "rose" / f"prefect-{version('prefect')}.db"


@pytest.mark.slow
def test_a_server_started_from_the_template_has_the_migrated_schema(tmp_path, monkeypatch):
    """Two real servers: the first migrates an empty database and leaves the template, the
    second starts from it and needs no migration."""
    from rose.stack.prefect_server import launch_prefect_server

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    schema = "SELECT version_num FROM alembic_version"
    found = []
    for name in ("first", "second"):
        server = launch_prefect_server(tmp_path / name)
        seeded = server.template is None
        try:
            server.wait()
            db = database_path(server.home)
            found.append((seeded, _rows(db, schema), _rows(db, "SELECT count(*) FROM block_type")))
        finally:
            server.stop()
    (fresh, version, blocks), (seeded, seeded_version, seeded_blocks) = found
    assert not fresh and seeded
    assert version and seeded_version == version and seeded_blocks == blocks and blocks[0][0] > 0
    assert _rows(template_path(), schema) == version
