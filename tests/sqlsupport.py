"""Seeing the SQL a piece of code sends (for the durability tests of the inbox's writes)."""

from contextlib import contextmanager

from django.db import connection


@contextmanager
def recorded_statements():
    """Yields the list of SQL strings the default connection executes inside the block."""
    statements = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield statements


def update_skipped_fsync(statements) -> bool:
    """Whether an UPDATE committed without waiting for the disk: on SQLite under synchronous=NORMAL, on
    PostgreSQL with synchronous_commit off. (The inbox's INSERT also commits NORMAL on SQLite, and then syncs
    the log itself before it returns: not a skip.)"""
    sqlite_normal = False
    for sql in statements:
        if sql.startswith("PRAGMA synchronous="):
            sqlite_normal = sql == "PRAGMA synchronous=NORMAL"
        elif sql.startswith("SET LOCAL synchronous_commit TO OFF; UPDATE") or (
                sqlite_normal and sql.startswith("UPDATE")):
            return True
    return False
