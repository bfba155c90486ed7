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


def skipped_fsync(statements) -> bool:
    """Whether one of the statements made its commit skip the fsync (SQLite or PostgreSQL)."""
    return any(sql == "PRAGMA synchronous=NORMAL" or sql.startswith("SET LOCAL synchronous_commit TO OFF")
               for sql in statements)
