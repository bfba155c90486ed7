"""Single-row writes for the webhook's hot path: the inbox row before enqueue, and its settle after.

`Model.objects.create()` and `save(update_fields=...)` spend most of a small write building the query
(about 0.2 ms each here, against under 0.1 ms for the statement itself), and a delivery makes two. These
build each statement once per model and field set, and still convert every value through the model's own
fields, so a new field or a JSON, bytes or datetime value is stored exactly as the ORM would store it.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import lru_cache

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.models import Model

from . import sqlite_wal

logger = logging.getLogger("pidispatch.db")


def _connection():
    # Resolved once per write: every attribute read through `django.db.connection` is a thread-local lookup,
    # and converting a row's values reads it dozens of times.
    return connections[DEFAULT_DB_ALIAS]


@lru_cache(maxsize=None)
def _insert_statement(model: type[Model], vendor: str):
    fields = tuple(field for field in model._meta.concrete_fields if not field.primary_key)
    quote = _connection().ops.quote_name
    sql = (f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
           f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {quote(model._meta.pk.column)}")
    return fields, sql


@lru_cache(maxsize=None)
def _update_statement(model: type[Model], names: tuple[str, ...], vendor: str):
    fields = tuple(model._meta.get_field(name) for name in names)
    quote = _connection().ops.quote_name
    sql = (f"UPDATE {quote(model._meta.db_table)} SET {', '.join(f'{quote(field.column)} = %s' for field in fields)} "
           f"WHERE {quote(model._meta.pk.column)} = %s")
    return fields, sql


def insert(instance: Model) -> Model:
    """INSERT one new instance (defaults and auto_now_add applied as `create()` does); sets its pk.
    A unique-constraint violation raises django.db.IntegrityError, as `create()` would.

    In autocommit the row is on disk when this returns, as under the settings' synchronous=FULL; SQLite
    commits it without its own fsync and the log is synced after the write lock is free (sqlite_wal.py)."""
    connection = _connection()
    fields, sql = _insert_statement(type(instance), connection.vendor)
    values = [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]
    if _sqlite_full_in_autocommit(connection):
        with _sqlite_commits_normal(connection) as cursor:
            cursor.execute(sql, values)
            instance.pk = cursor.fetchone()[0]
        sqlite_wal.sync_log(connection)  # on disk before we go on, without holding the write lock
    else:
        with connection.cursor() as cursor:
            cursor.execute(sql, values)
            instance.pk = cursor.fetchone()[0]
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance


def update(instance: Model, names: tuple[str, ...], *, wait_for_disk: bool = True) -> None:
    """UPDATE the named fields of a saved instance from its attributes (`auto_now` applied, as `save()` does).

    `wait_for_disk=False` commits without an fsync of its own, for a write whose loss in a power cut costs
    only a replay. SQLite (WAL, synchronous=FULL) commits it NORMAL: it is on disk with the next commit that
    syncs the log (any connection's: every insert here does) or the next checkpoint (the inbox replayer makes
    one every pass). PostgreSQL commits it with `synchronous_commit = off`: on disk within three WAL-writer
    delays. Either way it survives any crash of our processes and is never half applied; only a power cut or
    a kernel crash in between can undo it whole. Inside a caller's transaction, or without autocommit, the
    caller's commit decides.
    """
    connection = _connection()
    fields, sql = _update_statement(type(instance), names, connection.vendor)
    params = [field.get_db_prep_save(field.pre_save(instance, False), connection) for field in fields]
    params.append(instance.pk)
    relaxed = not wait_for_disk and connection.get_autocommit() and not connection.in_atomic_block
    if relaxed and connection.vendor == "postgresql" and not connection.settings_dict["OPTIONS"].get(
            "server_side_binding"):
        # One statement string in autocommit runs as one implicit transaction, so SET LOCAL covers the UPDATE
        # (client-side binding sends it as one simple query; server-side binding cannot, and waits instead).
        sql = "SET LOCAL synchronous_commit TO OFF; " + sql
    elif relaxed and _sqlite_full_in_autocommit(connection):
        with _sqlite_commits_normal(connection) as cursor:
            cursor.execute(sql, params)
        return
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _sqlite_full_in_autocommit(connection) -> bool:
    return (connection.vendor == "sqlite" and getattr(settings, "SQLITE_SYNCHRONOUS", "FULL") == "FULL"
            and connection.get_autocommit() and not connection.in_atomic_block)


@contextmanager
def _sqlite_commits_normal(connection):
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous=NORMAL")
        try:
            yield cursor
        finally:
            _restore_full_sync(connection, cursor)


def _restore_full_sync(connection, cursor) -> None:
    try:
        cursor.execute("PRAGMA synchronous=FULL")
    except DatabaseError:
        # The UPDATE has committed; what must not survive is a connection that skips the fsync. Closed, the
        # next use opens a new one with the settings' FULL.
        logger.error("sqlite_synchronous_restore_failed action=connection-closed")
        connection.close()
