"""Seeing the SQL a piece of code sends (for the durability tests of the inbox's writes)."""

from contextlib import contextmanager
from unittest import mock

from django.db import connection

from pidispatch_site import sqlite_wal

RELAXED_POSTGRESQL_COMMIT = "SET LOCAL synchronous_commit TO OFF; "


@contextmanager
def recorded_statements():
    """Yields the list of SQL strings the default connection executes inside the block."""
    statements = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield statements


@contextmanager
def recorded_writes(table: str):
    """Yields a list that is filled, when the block ends, with ("INSERT" or "UPDATE", waited) for each write to
    `table` inside the block, in order. `waited`: the write was on disk before the code went on. On SQLite
    (synchronous=FULL) that is a commit under FULL, or one under NORMAL whose log was synced before the next
    statement; on PostgreSQL, a commit without `synchronous_commit = off`."""
    events = []  # ("sql", text) and ("sync", None), as they happened
    real_fdatasync = sqlite_wal.os.fdatasync

    def record(execute, sql, params, many, context):
        events.append(("sql", sql))
        return execute(sql, params, many, context)

    def fdatasync(fd):
        events.append(("sync", None))
        real_fdatasync(fd)

    writes = []
    with connection.execute_wrapper(record), mock.patch.object(sqlite_wal.os, "fdatasync", fdatasync):
        yield writes
    writes.extend(_writes(events, table))


def _writes(events, table):
    sqlite_normal = False
    pending = None  # a write under NORMAL, waiting to see whether a sync follows it
    for kind, sql in events:
        if kind == "sync":
            if pending is not None:
                yield pending, True
                pending = None
            continue
        if sql.startswith("PRAGMA synchronous="):
            sqlite_normal = sql == "PRAGMA synchronous=NORMAL"
            continue
        relaxed_postgresql = sql.startswith(RELAXED_POSTGRESQL_COMMIT)
        statement = sql.removeprefix(RELAXED_POSTGRESQL_COMMIT).lstrip()
        verb = statement.split(None, 1)[0].upper() if statement else ""
        if verb not in ("INSERT", "UPDATE") or table not in statement.split("(", 1)[0].split(" SET ", 1)[0]:
            continue
        if pending is not None:
            yield pending, False
            pending = None
        if sqlite_normal:
            pending = verb
        else:
            yield verb, not relaxed_postgresql
    if pending is not None:
        yield pending, False
