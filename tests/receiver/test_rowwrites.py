"""The webhook's single-row writes (pidispatch_site/rowwrites.py) store exactly what the ORM would, a write that
waits for the disk commits synchronously, and one that does not never leaves the connection skipping the
fsync."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.receiver.models import Delivery, DeliveryStatus
from pidispatch_site import rowwrites
from tests.sqlsupport import recorded_statements, recorded_writes

pytestmark = pytest.mark.django_db

SETTLE_FIELDS = ("status", "reason", "job_ids", "payload", "processed_at", "next_attempt_at")


def stored(delivery_id="d-1", **fields):
    return rowwrites.insert(Delivery(forge="github", delivery_id=delivery_id, event="issues",
                                     payload=b"{\"x\": \"\\u00e9\"}\x00", attempted_at=timezone.now(), **fields))


def test_insert_stores_what_create_would_and_sets_the_pk():
    before = timezone.now()
    delivery = stored(attempts=1)

    row = Delivery.objects.get(pk=delivery.pk)
    assert (row.forge, row.delivery_id, row.event, row.attempts) == ("github", "d-1", "issues", 1)
    assert bytes(row.payload) == b"{\"x\": \"\\u00e9\"}\x00"
    assert (row.status, row.reason, row.job_ids, row.processed_at) == (DeliveryStatus.RECEIVED, "", [], None)
    assert row.received_at >= before and row.received_at == delivery.received_at  # auto_now_add applied
    assert row.attempted_at == delivery.attempted_at


def test_insert_of_a_stored_delivery_id_is_an_integrity_error():
    stored()
    with pytest.raises(IntegrityError), transaction.atomic():  # a savepoint, as the intake takes one in a transaction
        stored()
    assert Delivery.objects.count() == 1


def test_update_writes_the_named_fields_only():
    delivery = stored(reason="was-here")
    other = stored("d-2")
    delivery.status, delivery.job_ids, delivery.payload = DeliveryStatus.QUEUED, ["gh-d-1", "gh-d-1-r2"], None
    delivery.processed_at = timezone.now()
    delivery.event = "not-saved"

    rowwrites.update(delivery, ("status", "job_ids", "payload", "processed_at"))

    row = Delivery.objects.get(pk=delivery.pk)
    assert (row.status, row.job_ids, row.payload) == (DeliveryStatus.QUEUED, ["gh-d-1", "gh-d-1-r2"], None)
    assert (row.processed_at, row.event, row.reason) == (delivery.processed_at, "issues", "was-here")
    assert Delivery.objects.get(pk=other.pk).status == DeliveryStatus.RECEIVED


def written(write: str, delivery_id: str, wait_for_disk: bool) -> Delivery:
    """The row for `delivery_id`, written by the named write: inserted by rowwrites, or created through the
    ORM and then settled by a rowwrites update."""
    if write == "insert":
        return rowwrites.insert(Delivery(forge="github", delivery_id=delivery_id, event="issues", payload=b"{}",
                                         attempted_at=timezone.now()), wait_for_disk=wait_for_disk)
    delivery = Delivery.objects.create(forge="github", delivery_id=delivery_id, event="issues", payload=b"{}")
    delivery.status, delivery.payload = DeliveryStatus.QUEUED, None
    rowwrites.update(delivery, SETTLE_FIELDS, wait_for_disk=wait_for_disk)
    return delivery


@pytest.mark.parametrize("write", ["insert", "update"])
@pytest.mark.django_db(transaction=True)
def test_a_write_that_skips_the_fsync_leaves_the_connection_syncing_every_commit(write, settings):
    with recorded_writes(Delivery._meta.db_table) as writes, recorded_statements() as statements:
        delivery = written(write, "d-fast", wait_for_disk=False)

    row = Delivery.objects.get(pk=delivery.pk)
    assert row.status == (DeliveryStatus.RECEIVED if write == "insert" else DeliveryStatus.QUEUED)
    verb = write.upper()
    assert writes[-1] == (verb, False)  # not synced before the code went on
    written_by = [sql for sql in statements if verb in sql]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            assert settings.SQLITE_SYNCHRONOUS == "FULL"
            at = statements.index(written_by[-1])
            assert statements[at - 1] == "PRAGMA synchronous=NORMAL" and statements[at + 1] == "PRAGMA synchronous=FULL"
            cursor.execute("PRAGMA synchronous")
            assert cursor.fetchone()[0] == 2  # FULL
        else:
            assert written_by[-1].startswith(f"SET LOCAL synchronous_commit TO OFF; {verb}")
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"  # SET LOCAL ended with its statement's transaction


@pytest.mark.parametrize("write", ["insert", "update"])
@pytest.mark.django_db(transaction=True)
def test_a_write_that_waits_for_the_disk_commits_as_the_connection_does(write):
    with recorded_writes(Delivery._meta.db_table) as writes, recorded_statements() as statements:
        written(write, "d-slow", wait_for_disk=True)

    assert writes[-1] == (write.upper(), True)  # SQLite: a commit under FULL; PostgreSQL: a synchronous commit
    assert not [sql for sql in statements if "synchronous" in sql]  # nothing relaxed, nothing to restore


def test_inside_a_callers_transaction_the_callers_commit_decides():
    delivery = stored()
    delivery.status = DeliveryStatus.QUEUED
    with transaction.atomic(), recorded_statements() as statements:
        rowwrites.update(delivery, ("status",), wait_for_disk=False)

    assert len(statements) == 1 and statements[0].startswith("UPDATE")
    assert Delivery.objects.get(pk=delivery.pk).status == DeliveryStatus.QUEUED
