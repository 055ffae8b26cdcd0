"""The local Prefect server's SQLite database, and the template a new one starts from.

Prefect migrates an empty database in about half of its server's start (some 40 alembic
migrations: ~7 of ~15 CPU-s on this 2-core machine). So the first server to start from an empty
database leaves a copy of it, taken once it answers (migrated, its block types registered, no
runs yet), in the user's cache, one per Prefect version; every later new database starts as a
copy and the server's migration check finds nothing to do. A stack whose database exists (a
restart on the same data directory) keeps it.
"""
from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from importlib.metadata import version
from pathlib import Path

from storage.atomic import atomic_path

DATABASE = "prefect.db"
log = logging.getLogger(__name__)


def database_path(home: Path) -> Path:
    return Path(home) / DATABASE


def template_path() -> Path:
    """Per user ($XDG_CACHE_HOME, else ~/.cache) and per Prefect version: its migrations define
    the schema."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rose" / f"prefect-{version('prefect')}.db"


def seed_database(db: Path, template: Path) -> bool:
    """Start a new database at `db` as a copy of `template`; False (nothing done) when `db`
    exists or there is no template."""
    if db.exists() or not template.is_file():
        return False
    with atomic_path(db) as tmp:
        shutil.copyfile(template, tmp)
    return True


def save_template(db: Path, template: Path) -> bool:
    """Keep `db` (a running server's) as the template: SQLite's online backup, a consistent copy
    while the server writes. A failure only costs later starts their speed: logged, not raised."""
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(template) as tmp:
            source, copy = sqlite3.connect(db), sqlite3.connect(tmp)
            try:
                source.backup(copy)
            finally:
                copy.close()
                source.close()
        return True
    except (OSError, sqlite3.Error) as e:
        log.warning("could not keep the Prefect database template %s: %s", template, e)
        return False
