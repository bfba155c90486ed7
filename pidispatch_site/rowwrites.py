"""Single-row writes for the webhook's hot path: the inbox row before enqueue, and its settle after.

`Model.objects.create()` and `save(update_fields=...)` spend most of a small write building the query
(about 0.2 ms each here, against under 0.1 ms for the statement itself), and a delivery makes two. These
build each statement once per model and field set, and still convert every value through the model's own
fields, so a new field or a JSON, bytes or datetime value is stored exactly as the ORM would store it.
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.models import Model


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
    A unique-constraint violation raises django.db.IntegrityError, as `create()` would."""
    connection = _connection()
    fields, sql = _insert_statement(type(instance), connection.vendor)
    values = [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        instance.pk = cursor.fetchone()[0]
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance


def update(instance: Model, names: tuple[str, ...], *, wait_for_disk: bool = True) -> None:
    """UPDATE the named fields of a saved instance, from its current attribute values.

    `wait_for_disk=False` commits without an fsync of its own, for a write whose loss in a power cut
    costs only a replay: SQLite (WAL, synchronous=FULL) commits it NORMAL, synced by the next FULL commit or
    checkpoint; PostgreSQL commits it with `synchronous_commit = off`. Either way it survives any crash of
    our processes and is never half applied; only a power cut or a kernel crash in the next moment can undo
    it whole. Inside a caller's transaction the caller's commit decides.
    """
    connection = _connection()
    fields, sql = _update_statement(type(instance), names, connection.vendor)
    params = [field.get_db_prep_save(getattr(instance, field.attname), connection) for field in fields]
    params.append(instance.pk)
    relaxed = not wait_for_disk and not connection.in_atomic_block
    if relaxed and connection.vendor == "postgresql":
        # One statement string in autocommit runs as one implicit transaction: SET LOCAL covers the UPDATE.
        sql = "SET LOCAL synchronous_commit TO OFF; " + sql
    elif relaxed and connection.vendor == "sqlite" and getattr(settings, "SQLITE_SYNCHRONOUS", "FULL") == "FULL":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous=NORMAL")
            try:
                cursor.execute(sql, params)
            finally:
                try:
                    cursor.execute("PRAGMA synchronous=FULL")
                except DatabaseError:
                    connection.close()  # never keep a connection that skips the fsync: the next one opens FULL
                    raise
        return
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
