"""SQLite's log is copied into the database file by the inbox replayer, not inside a webhook's commit."""

import sqlite3

import pytest
from django.db import connection

from apps.receiver.models import Delivery
from pidispatch_site import sqlite_wal

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's write-ahead log only"),
]


def rows_in_the_database_file() -> int:
    """Count what the database file itself holds, ignoring the log (as if nothing were checkpointed yet)."""
    file = sqlite3.connect(f"file:{connection.settings_dict['NAME']}?immutable=1", uri=True)
    try:
        return file.execute(f"SELECT COUNT(*) FROM {Delivery._meta.db_table}").fetchone()[0]
    finally:
        file.close()


def test_commits_leave_the_log_to_the_replayers_checkpoint():
    sqlite_wal.checkpoint()
    for number in range(20):
        Delivery.objects.create(forge="github", delivery_id=f"d-{number}", payload=b"x" * 9000)

    assert Delivery.objects.count() == 20
    assert rows_in_the_database_file() == 0  # still only in the log: no commit checkpointed

    sqlite_wal.checkpoint()

    assert rows_in_the_database_file() == 20


def test_the_replayer_checkpoints_on_every_pass(monkeypatch):
    from django.core.management import call_command

    from apps.receiver.management.commands import replay_deliveries

    passes = []
    monkeypatch.setattr(replay_deliveries.sqlite_wal, "checkpoint", lambda: passes.append(1))
    monkeypatch.setattr(replay_deliveries.Command, "_sleep", lambda self, seconds: setattr(self, "_stopping", True))

    call_command("replay_deliveries", "--follow")

    assert passes == [1]
