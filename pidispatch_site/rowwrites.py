"""Single-row writes for the webhook's hot path: the inbox row (written before an enqueue or a lookup, or
settled at once) and its settle.

`Model.objects.create()` and `save(update_fields=...)` spend most of a small write building the query
(about 0.2 ms each here, against under 0.1 ms for the statement itself), and a delivery makes two. These
build each statement once per model and field set, and still convert every value through the model's own
fields, so a new field or a JSON, bytes or datetime value is stored exactly as the ORM would store it.
Measured: the ORM's writes make a queued delivery cost about 18% more (docs/architecture.md, "Hand-made
fast paths"). Each write also says whether it waits for the disk (`_autocommit_write`).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import cache

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.models import Model

logger = logging.getLogger("pidispatch.db")


def _connection():
    # Resolved once per write: every attribute read through `django.db.connection` is a thread-local lookup,
    # and converting a row's values reads it dozens of times.
    return connections[DEFAULT_DB_ALIAS]


@cache
def _insert_statement(model: type[Model], vendor: str):
    fields = tuple(field for field in model._meta.concrete_fields if not field.primary_key)
    quote = _connection().ops.quote_name
    sql = (f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
           f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {quote(model._meta.pk.column)}")
    return fields, sql


@cache
def _update_statement(model: type[Model], names: tuple[str, ...], vendor: str):
    fields = tuple(model._meta.get_field(name) for name in names)
    quote = _connection().ops.quote_name
    sql = (f"UPDATE {quote(model._meta.db_table)} SET {', '.join(f'{quote(field.column)} = %s' for field in fields)} "
           f"WHERE {quote(model._meta.pk.column)} = %s")
    return fields, sql


def insert(instance: Model, *, wait_for_disk: bool = True) -> Model:
    """INSERT one new instance (defaults and auto_now_add applied as `create()` does); sets its pk.
    A unique-constraint violation raises django.db.IntegrityError, as `create()` would. `wait_for_disk` as
    for `update()`."""
    connection = _connection()
    fields, sql = _insert_statement(type(instance), connection.vendor)
    values = [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]
    with _autocommit_write(connection, sql, values, wait_for_disk) as cursor:
        instance.pk = cursor.fetchone()[0]
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance


def update(instance: Model, names: tuple[str, ...], *, wait_for_disk: bool = True) -> None:
    """UPDATE the named fields of a saved instance from its attributes (`auto_now` applied, as `save()` does)."""
    connection = _connection()
    fields, sql = _update_statement(type(instance), names, connection.vendor)
    params = [field.get_db_prep_save(field.pre_save(instance, False), connection) for field in fields]
    params.append(instance.pk)
    with _autocommit_write(connection, sql, params, wait_for_disk):
        pass


@contextmanager
def _autocommit_write(connection, sql: str, params: list, wait_for_disk: bool):
    """Run one statement as its own transaction and yield the cursor holding its result.

    `wait_for_disk=True`: the write is on disk when this returns (the connection's own commit: SQLite
    synchronous=FULL, PostgreSQL synchronous_commit on).

    `wait_for_disk=False`, for a write whose durable copy is elsewhere or whose loss in a power cut costs only a
    replay: SQLite commits it NORMAL (on disk with the next commit that syncs the log, any connection's, or
    the next checkpoint); PostgreSQL with `synchronous_commit = off` (in its log within three WAL-writer
    delays). Either way it survives any crash of our processes and is never half applied; a power cut, a
    kernel crash or (PostgreSQL) a crash of the database server in between can undo it whole.

    Inside a caller's transaction, or without autocommit, the caller's commit decides.
    """
    autocommit = connection.get_autocommit() and not connection.in_atomic_block
    relaxed = autocommit and not wait_for_disk
    if relaxed and connection.vendor == "sqlite" and getattr(settings, "SQLITE_SYNCHRONOUS", "FULL") == "FULL":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous=NORMAL")
            try:
                cursor.execute(sql, params)
                yield cursor
            finally:
                _restore_full_sync(connection, cursor)
        return
    relaxed = relaxed and connection.vendor == "postgresql"
    if relaxed and connection.settings_dict["OPTIONS"].get("server_side_binding"):
        relaxed = False  # server-side binding cannot send two statements at once: this write waits instead
    with connection.cursor() as cursor:
        if relaxed:
            # One statement string in autocommit runs as one implicit transaction, so SET LOCAL covers the write.
            cursor.execute("SET LOCAL synchronous_commit TO OFF; " + sql, params)
            cursor.nextset()  # from the SET's result to the write's
        else:
            cursor.execute(sql, params)
        yield cursor


def _restore_full_sync(connection, cursor) -> None:
    try:
        cursor.execute("PRAGMA synchronous=FULL")
    except DatabaseError:
        # The write has committed; what must not survive is a connection that skips the fsync. Closed, the
        # next use opens a new one with the settings' FULL.
        logger.error("sqlite_synchronous_restore_failed action=connection-closed")
        connection.close()
