"""The SQLite database file, made ready before any connection opens it: this user's only, and in WAL mode."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

from pidispatch_site.private_files import private_file


def prepare_database_file(path: Path, lock_timeout: float) -> None:
    """Creates the file 0600 (SQLite gives its -wal and -shm files the database's mode), then puts it in WAL
    mode. The mode is kept in the file, so each connection's own `PRAGMA journal_mode=WAL` then finds it set
    and takes no lock.

    Processes starting at once on a fresh installation would otherwise all convert it on their first
    connection, and SQLite refuses all but one of them at once, "database is locked" without waiting out the
    busy timeout: each holds the read lock the others must see gone. So a refused start waits a moment and
    tries again, up to `lock_timeout`. Any other error is left to the first connection, which reports it
    where Django reports a database that cannot be opened."""
    private_file(path)
    deadline = time.monotonic() + lock_timeout
    while True:
        try:
            connection = sqlite3.connect(path, timeout=lock_timeout)
            try:
                connection.execute("PRAGMA journal_mode=WAL")
            finally:
                connection.close()
            return
        except sqlite3.Error as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                return
        time.sleep(random.uniform(0.005, 0.05))  # apart, so that the next try is not another tie
