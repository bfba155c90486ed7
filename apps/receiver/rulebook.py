"""The forge rules matching reads, kept per process and reloaded only when the trigger table changed.

A delivery costs one tiny query (`COUNT`, `MAX(updated_at)`, `MAX(id)` of the table) instead of loading
and building every rule again. Every write to triggers changes that fingerprint: saves stamp
`updated_at`, deletions change the count, and the services that use `QuerySet.update` stamp
`updated_at` themselves (apps/receiver/triggers.py).
"""

from __future__ import annotations

import threading

from django.db import connection

from .models import Trigger

_lock = threading.Lock()
_loaded: tuple[object, list[Trigger]] = (None, [])


def _fingerprint():
    table = connection.ops.quote_name(Trigger._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*), MAX(updated_at), MAX(id) FROM {table}")
        return tuple(cursor.fetchone())


def forge_rules() -> list[Trigger]:
    """Enabled, armed, non-cron rules of every forge, in matching order (read-only: do not modify them)."""
    global _loaded
    fingerprint = _fingerprint()
    with _lock:
        if _loaded[0] != fingerprint:
            _loaded = (fingerprint, list(Trigger.objects.forge_rules()))
        return _loaded[1]


def forget() -> None:
    global _loaded
    with _lock:
        _loaded = (None, [])
