"""Seeing the SQL a piece of code sends (for the durability tests of the inbox's writes)."""

from contextlib import contextmanager

from django.db import connection

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
    `table` inside the block, in order. `waited`: the write was on disk before the code went on, i.e. it
    committed under synchronous=FULL on SQLite (the connection's setting unless a `PRAGMA synchronous=NORMAL`
    is in force), without `synchronous_commit = off` on PostgreSQL."""
    with recorded_statements() as statements:
        writes = []
        yield writes
    writes.extend(_writes(statements, table))


def _writes(statements, table):
    with connection.cursor() as cursor:  # the connection's own setting (the writes restore it after NORMAL)
        sqlite_full = connection.vendor != "sqlite" or _sqlite_synchronous(cursor) >= 2
    for sql in statements:
        if sql.startswith("PRAGMA synchronous="):
            sqlite_full = sql != "PRAGMA synchronous=NORMAL"
            continue
        relaxed_postgresql = sql.startswith(RELAXED_POSTGRESQL_COMMIT)
        statement = sql.removeprefix(RELAXED_POSTGRESQL_COMMIT).lstrip()
        verb = statement.split(None, 1)[0].upper() if statement else ""
        if verb not in ("INSERT", "UPDATE") or table not in statement.split("(", 1)[0].split(" SET ", 1)[0]:
            continue
        yield verb, sqlite_full and not relaxed_postgresql


def _sqlite_synchronous(cursor) -> int:
    cursor.execute("PRAGMA synchronous")
    return cursor.fetchone()[0]
