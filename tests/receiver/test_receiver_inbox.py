"""The inbox never loses a delivery: Redis down, the database down, forge lookups that cannot be answered,
our own bugs; the replayer (`replay_deliveries`) and the admin's replay and discard actions."""

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.utils import timezone
from rq import Queue

from apps.fleet import connection as fleet_connection
from apps.receiver import intake
from apps.receiver.models import Delivery, DeliveryStatus
from devtools import services
from tests.conftest import ROOT, wait_for
from tests.receiver_support import dumps, github_headers, load, post, queued, rule
from tests.sqlsupport import recorded_writes

pytestmark = pytest.mark.django_db


def labelled(number):
    payload = load("github/issues_labeled.json")
    payload["issue"]["number"] = number
    return payload


def deliver(client, number, delivery):
    body = dumps(labelled(number))
    return post(client, "github", body, github_headers(body, "issues", delivery))


@pytest.fixture
def label_rule(db):
    return rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")


@pytest.fixture
def redis_down(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    fleet_connection._client.cache_clear()
    yield
    fleet_connection._client.cache_clear()


@pytest.fixture
def own_redis(tmp_path, settings):
    """A redis-server of this test's own (persistent, like a real one), so the test may stop and restart it."""
    port = services.free_port()
    data = tmp_path / "redis"

    class OwnRedis:
        url = f"redis://127.0.0.1:{port}/0"

        def __init__(self):
            self.service = None

        def start(self):
            self.service = services.start_redis(data, port, persistent=True)

        def stop(self):
            self.service.stop()

        def kill(self):
            """The way a crash or the OOM killer ends Redis: no shutdown save."""
            os.killpg(self.service.process.pid, signal.SIGKILL)
            self.service.process.wait(10)

    redis = OwnRedis()
    redis.start()
    settings.REDIS_URL = redis.url
    fleet_connection._client.cache_clear()
    yield redis
    redis.stop()
    fleet_connection._client.cache_clear()


# --- Redis down -------------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_redis_stopped_mid_test_deliveries_become_jobs_exactly_once_when_it_returns(
        client, forges, label_rule, own_redis, worker_env, tmp_path):
    import redis as redis_py

    assert deliver(client, 1, "d-before").json()["status"] == "queued"
    own_redis.stop()

    answers = [deliver(client, number, f"d-during-{number}") for number in (2, 3, 4)]

    assert all((a.status_code, a.json()) == (202, {"status": "accepted"}) for a in answers)
    pending = Delivery.objects.filter(status=DeliveryStatus.PENDING).order_by("received_at")
    assert [d.delivery_id for d in pending] == ["d-during-2", "d-during-3", "d-during-4"]
    assert all(d.payload is not None and d.reason == "redis-unavailable" for d in pending)

    # The replayer runs before Redis is back: it waits, then enqueues in arrival order on its own.
    env = {**worker_env, "REDIS_URL": own_redis.url, "PI_INBOX_POLL_SECONDS": "0.2",
           "GITHUB_API_URL": forges.url}
    log = tmp_path / "replayer.log"
    with open(log, "w") as sink:
        replayer = subprocess.Popen([sys.executable, "manage.py", "replay_deliveries", "--follow"], cwd=ROOT, env=env,
                                    stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "Redis is unreachable" in log.read_text(), timeout=60, what="the replayer to notice Redis")
        own_redis.start()
        connection = redis_py.Redis.from_url(own_redis.url)
        wait_for(lambda: len(Queue("pi-jobs", connection=connection).get_job_ids()) == 4, timeout=60,
                 what="the pending deliveries to become jobs")
    finally:
        os.killpg(replayer.pid, signal.SIGTERM)
        replayer.wait(timeout=30)
    output = log.read_text()
    assert replayer.returncode == 0, output
    assert "Redis is back" in output

    jobs = Queue("pi-jobs", connection=connection).get_job_ids()
    assert jobs == ["gh-d-before", "gh-d-during-2", "gh-d-during-3", "gh-d-during-4"]  # arrival order, once each
    assert set(Delivery.objects.values_list("status", flat=True)) == {DeliveryStatus.QUEUED}
    assert not Delivery.objects.filter(payload__isnull=False).exists()

    result = subprocess.run([sys.executable, "manage.py", "replay_deliveries"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "replayed 0 delivery(ies); 0 still pending" in result.stdout
    assert Queue("pi-jobs", connection=connection).get_job_ids() == jobs


def test_a_killed_redis_keeps_the_jobs_of_settled_deliveries(client, forges, label_rule, own_redis):
    import redis as redis_py

    assert deliver(client, 1, "d-kept").json()["status"] == "queued"
    assert Delivery.objects.get(delivery_id="d-kept").payload is None  # the job is now the only copy
    # Killed, not shut down: nothing saves on the way out. Redis writes (and, appendfsync always, syncs) its
    # append-only file before it answers, so the job survives the process, and a power cut too.
    own_redis.kill()
    own_redis.start()

    assert Queue("pi-jobs", connection=redis_py.Redis.from_url(own_redis.url)).get_job_ids() == ["gh-d-kept"]


def test_the_replayer_warns_when_redis_would_lose_queued_jobs(own_redis, capsys):
    from django.core.management import call_command

    call_command("replay_deliveries")
    assert "Redis" not in capsys.readouterr().err  # make run's Redis: append-only file, synced on every write

    fleet_connection.get_redis().config_set("appendfsync", "everysec")
    call_command("replay_deliveries")
    assert intake.UNSYNCED_QUEUE_WARNING.format(policy="everysec") in capsys.readouterr().err

    fleet_connection.get_redis().config_set("appendonly", "no")
    call_command("replay_deliveries")
    assert intake.UNLOGGED_QUEUE_WARNING in capsys.readouterr().err


def test_a_redis_folder_from_before_the_append_only_file_keeps_its_data(tmp_path):
    import redis as redis_py

    port, data = services.free_port(), tmp_path / "redis"
    data.mkdir()
    old = services.spawn(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                          "--save", "60 1", "--appendonly", "no"])
    url = f"redis://127.0.0.1:{port}/0"
    services.wait_until(lambda: services.redis_answers(url), 20, "the old-style redis-server")
    redis_py.Redis.from_url(url).rpush("rq:queue:pi-jobs", "gh-old")
    os.killpg(old.pid, signal.SIGTERM)  # the old setup's shutdown snapshot
    old.wait(20)

    service = services.start_redis(data, port, persistent=True)
    try:
        assert redis_py.Redis.from_url(url).lrange("rq:queue:pi-jobs", 0, -1) == [b"gh-old"]
        config = redis_py.Redis.from_url(url).config_get("append*")
        assert (config["appendonly"], config["appendfsync"]) == ("yes", "always")
    finally:
        service.stop()
    service = services.start_redis(data, port, persistent=True)  # now from the append-only file
    try:
        assert redis_py.Redis.from_url(url).lrange("rq:queue:pi-jobs", 0, -1) == [b"gh-old"]
        assert redis_py.Redis.from_url(url).config_get("appendfsync") == {"appendfsync": "always"}
    finally:
        service.stop()


def test_one_shot_replay_command_reports_redis_down(forges, label_rule, redis_down, client, capsys):
    deliver(client, 2, "d-wait")
    with pytest.raises(SystemExit) as exited:
        from django.core.management import call_command

        call_command("replay_deliveries")
    assert exited.value.code == 1
    assert "Redis is unreachable: nothing was replayed" in capsys.readouterr().err
    assert Delivery.objects.get(delivery_id="d-wait").status == DeliveryStatus.PENDING


# --- the database down -----------------------------------------------------------------------------------------

@contextmanager
def inbox_unwritable():
    """Every statement that would store a delivery fails as it does when the database server is gone."""
    def refuse(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("INSERT") and Delivery._meta.db_table in sql:
            raise OperationalError("could not connect to server")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse):
        yield


def test_database_down_spools_the_delivery_to_redis_and_the_replayer_moves_it_in(
        client, forges, label_rule, redis_conn):
    with inbox_unwritable():
        response = deliver(client, 5, "d-spooled")

    assert (response.status_code, response.json()) == (202, {"status": "accepted"})
    assert Delivery.objects.count() == 0 and redis_conn.llen(intake.SPOOL_KEY) == 1

    report = intake.replay_due()

    assert report.moved_from_spool == 1 and report.outcomes == {"queued": 1}
    delivery = Delivery.objects.get(delivery_id="d-spooled")
    assert (delivery.status, delivery.job_ids, delivery.payload) == (DeliveryStatus.QUEUED, ["gh-d-spooled"], None)
    assert redis_conn.llen(intake.SPOOL_KEY) == 0 and queued(redis_conn) == ["gh-d-spooled"]


@contextmanager
def inbox_unsettleable():
    """The database takes the delivery's row, then fails every later write to it (a server that went away)."""
    def refuse(execute, sql, params, many, context):
        if f'UPDATE "{Delivery._meta.db_table}"' in sql:  # also behind PostgreSQL's SET LOCAL
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse):
        yield


@pytest.mark.django_db(transaction=True)
def test_a_delivery_the_database_fails_after_storing_it_is_spooled_too_and_queued_once(
        client, forges, label_rule, redis_conn):
    with inbox_unsettleable():
        response = deliver(client, 6, "d-unsettled")

    # Its row was written without waiting for the disk, and cannot be settled: before the forge hears
    # "accepted", a copy goes to the spool. Never a 5xx.
    assert (response.status_code, response.json()) == (202, {"status": "accepted"})
    delivery = Delivery.objects.get(delivery_id="d-unsettled")
    assert (delivery.status, delivery.payload is not None) == (DeliveryStatus.RECEIVED, True)
    assert redis_conn.llen(intake.SPOOL_KEY) == 1

    Delivery.objects.filter(pk=delivery.pk).update(attempted_at=timezone.now() - timedelta(minutes=5))
    assert intake.replay_due().outcomes == {"queued": 1}  # the spooled copy is the same delivery: dropped
    assert queued(redis_conn) == ["gh-d-unsettled"] and Delivery.objects.count() == 1
    assert redis_conn.llen(intake.SPOOL_KEY) == 0


@pytest.mark.django_db(transaction=True)
def test_a_pending_delivery_whose_write_the_disk_refuses_is_spooled_to_redis(
        client, forges, label_rule, redis_conn, monkeypatch):
    def disk_refuses_the_pend(execute, sql, params, many, context):
        if sql.lstrip().startswith(("INSERT", "UPDATE")) and "pending" in (params or ()):
            raise OperationalError("disk I/O error")  # what a commit whose fsync fails reports
        return execute(sql, params, many, context)

    monkeypatch.setattr(intake, "self_identity", lambda forge: None)  # the identity gate keeps it pending
    with connection.execute_wrapper(disk_refuses_the_pend):
        response = deliver(client, 7, "d-unsynced")

    # The pend (the row's first write) did not reach the disk: Redis holds a copy before the forge hears
    # "accepted", and the replayer moves it into the inbox.
    assert (response.status_code, response.json()) == (202, {"status": "accepted"})
    assert not Delivery.objects.filter(delivery_id="d-unsynced").exists()
    assert redis_conn.llen(intake.SPOOL_KEY) == 1
    assert intake.drain_spool() == 1
    assert Delivery.objects.get(delivery_id="d-unsynced").payload is not None


def test_only_when_neither_the_database_nor_redis_can_take_it_is_the_answer_503(
        client, forges, label_rule, redis_down):
    with inbox_unwritable():
        response = deliver(client, 6, "d-lost")

    assert (response.status_code, response.json()) == (503, {"error": "store-failed"})


# --- pending deliveries ----------------------------------------------------------------------------------------

def test_pending_lookups_wait_for_their_backoff(client, forges, redis_conn):
    rule(position=0, kind="github", on_type="issue", actions=["closed"], flow="retro")
    forges.routes["/repos/acme/web/collaborators/maintainer-mia/permission"] = (500, {})
    payload = labelled(7)
    payload["action"] = "closed"
    body = dumps(payload)
    post(client, "github", body, github_headers(body, "issues", "d-back"))
    delivery = Delivery.objects.get()
    assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=10)

    forges.github_permission("acme/web", "maintainer-mia", "write")
    assert intake.replay_due().outcomes is None  # not due yet
    assert intake.replay_due(ignore_backoff=True).outcomes == {"queued": 1}
    assert queued(redis_conn) == ["gh-d-back"]


def test_a_delivery_is_stored_with_its_payload_before_its_authority_lookup(client, forges, redis_conn, monkeypatch):
    """A lookup can take the forge's whole timeout: a process that dies meanwhile leaves a row to replay."""
    rule(position=0, kind="github", on_type="issue", actions=["closed"], flow="retro")
    forges.github_permission("acme/web", "maintainer-mia", "write")
    payload = labelled(8)
    payload["action"] = "closed"
    body = dumps(payload)
    rows_during_lookup = []
    real_check = intake.authority.check

    def check(event, whom):
        rows_during_lookup.extend((row.status, bytes(row.payload)) for row in Delivery.objects.all())
        return real_check(event, whom)

    monkeypatch.setattr(intake.authority, "check", check)
    assert post(client, "github", body, github_headers(body, "issues", "d-look")).json()["status"] == "queued"
    assert rows_during_lookup == [(DeliveryStatus.RECEIVED, body)]
    assert Delivery.objects.get(delivery_id="d-look").payload is None


def test_a_settle_that_fails_before_its_row_is_written_keeps_the_payload(client, forges, label_rule, monkeypatch):
    """An ignored delivery's settle is its first write; if our code fails there, the pend that keeps the
    delivery holds it as it arrived (the settle had already let go of the payload)."""
    from pidispatch_site import rowwrites

    real_insert = rowwrites.insert

    def insert(instance, **kwargs):
        if instance.status == DeliveryStatus.IGNORED:
            raise TypeError("a value the field cannot convert")
        return real_insert(instance, **kwargs)

    monkeypatch.setattr(rowwrites, "insert", insert)
    payload = labelled(10)
    payload["issue"]["labels"] = [{"name": "docs"}]
    body = dumps(payload)
    response = post(client, "github", body, github_headers(body, "issues", "d-kept-text"))

    assert (response.status_code, response.json()) == (202, {"status": "accepted"})
    delivery = Delivery.objects.get(delivery_id="d-kept-text")
    assert (delivery.status, delivery.reason, bytes(delivery.payload)) == (
        DeliveryStatus.PENDING, "processing-error", body)
    assert (delivery.processed_at, delivery.job_ids) == (None, [])  # nothing of the failed settle


def test_a_delivery_whose_process_died_is_picked_up(forges, label_rule, redis_conn):
    delivery = Delivery.objects.create(forge="github", delivery_id="d-orphan", event="issues",
                                       payload=dumps(labelled(9)), attempts=1,
                                       attempted_at=timezone.now() - timedelta(minutes=5))

    assert intake.replay_due().outcomes == {"queued": 1}
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.QUEUED, 2)


def test_a_settle_undone_by_a_power_cut_replays_without_running_the_job_again(
        client, forges, label_rule, redis_conn, settings):
    """The settle commits without waiting for the disk. If a power cut undoes it, the row is back to
    "received" with its payload; by the time it is replayed RQ may have forgotten the finished job and the
    dedup window may be over. The run record still stops a second run."""
    from apps.worker.models import Outcome, Run

    assert deliver(client, 11, "d-cut").json() == {"status": "queued", "jobs": ["gh-d-cut"]}
    now = timezone.now()
    Run.objects.create(job_id="gh-d-cut", kind="github", target="acme/web#11", started_at=now, ended_at=now,
                       outcome=Outcome.COMPLETED)
    redis_conn.flushdb()  # the finished job and the semantic claim have expired
    Delivery.objects.filter(delivery_id="d-cut").update(  # the settle, undone
        status=DeliveryStatus.RECEIVED, payload=dumps(labelled(11)), job_ids=[], processed_at=None,
        attempted_at=now - timedelta(minutes=5))

    assert intake.replay_due().outcomes == {"queued": 1}
    delivery = Delivery.objects.get(delivery_id="d-cut")
    assert (delivery.status, delivery.job_ids, delivery.payload) == (DeliveryStatus.QUEUED, ["gh-d-cut"], None)
    assert queued(redis_conn) == []


@pytest.mark.django_db(transaction=True)
def test_a_queued_delivery_waits_for_no_database_fsync_and_every_other_outcome_for_one(
        client, forges, label_rule, redis_conn):
    """A queued delivery's durable copy is its job (Redis syncs it before answering), so neither its row nor
    the settle waits for the database's disk; replayed after a power cut, it lands on the same job ids. Any
    other outcome is the delivery's only record and would be decided anew (the rules may have changed), so
    it is on disk before the answer."""
    table = Delivery._meta.db_table
    with recorded_writes(table) as writes:
        assert deliver(client, 12, "d-fast").json()["status"] == "queued"
    assert writes == [("INSERT", False), ("UPDATE", False)]
    assert Delivery.objects.get(delivery_id="d-fast").payload is None

    payload = labelled(13)
    payload["issue"]["labels"] = [{"name": "docs"}]
    body = dumps(payload)
    with recorded_writes(table) as writes:
        assert post(client, "github", body, github_headers(body, "issues", "d-slow")).json()["status"] == "ignored"
    assert writes == [("INSERT", True)]  # decided from the delivery alone: one write, the settled row
    assert Delivery.objects.get(delivery_id="d-slow").payload is None


@pytest.mark.django_db(transaction=True)
def test_an_outcome_decided_from_the_delivery_alone_is_the_rows_only_write(client, forges, label_rule):
    """Most webhooks match no trigger: their row is written once, settled, and never holds the payload."""
    table = Delivery._meta.db_table
    payload = labelled(15)
    payload["issue"]["labels"] = [{"name": "docs"}]
    body = dumps(payload)
    with recorded_writes(table) as writes:
        response = post(client, "github", body, github_headers(body, "issues", "d-once"))
    assert (response.status_code, response.json()) == (200, {"status": "ignored", "reason": "no-allowlisted-label"})
    assert writes == [("INSERT", True)]  # and that row holds no payload: the texts were never stored
    delivery = Delivery.objects.get(delivery_id="d-once")
    assert (delivery.status, delivery.reason, delivery.payload) == (DeliveryStatus.IGNORED, "no-allowlisted-label",
                                                                    None)
    assert delivery.received_at and delivery.processed_at and delivery.attempts == 1

    payload = labelled(16)
    del payload["issue"]["number"]  # verified, but the normaliser refuses it: rejected, stored once
    body = dumps(payload)
    with recorded_writes(table) as writes:
        response = post(client, "github", body, github_headers(body, "issues", "d-bad"))
    assert (response.status_code, response.json()) == (400, {"error": "missing-issue-number"})
    assert writes == [("INSERT", True)]
    assert Delivery.objects.get(delivery_id="d-bad").status == DeliveryStatus.REJECTED


@pytest.mark.django_db(transaction=True)
def test_a_delivery_kept_while_redis_is_down_is_on_disk_before_its_answer(client, forges, label_rule, redis_down):
    with recorded_writes(Delivery._meta.db_table) as writes:
        assert deliver(client, 14, "d-kept").json() == {"status": "accepted"}
    assert writes == [("INSERT", False), ("UPDATE", True)]  # the pend waits, and the row is in the same log
    assert Delivery.objects.get(delivery_id="d-kept").status == DeliveryStatus.PENDING


def test_our_own_bug_keeps_the_delivery_and_never_answers_500(client, forges, label_rule, monkeypatch, caplog):
    from apps.receiver import intake as intake_module

    def broken(*args, **kwargs):
        raise KeyError("Checkout button overlaps the footer")  # an error message may quote payload text

    monkeypatch.setattr(intake_module, "decide", broken)
    with caplog.at_level("INFO"):
        response = deliver(client, 7, "d-bug")

    assert (response.status_code, response.json()) == (202, {"status": "accepted"})
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.reason) == (DeliveryStatus.PENDING, "processing-error")
    assert delivery.payload is not None
    assert "error=KeyError" in caplog.text and "Checkout button" not in caplog.text


def test_redeliveries_get_the_first_answer(client, forges, label_rule, redis_down):
    assert deliver(client, 2, "d-again").json() == {"status": "accepted"}
    assert deliver(client, 2, "d-again").json() == {"status": "accepted"}  # pending: on disk already

    payload = labelled(3)
    payload["issue"]["labels"] = [{"name": "docs"}]
    body = dumps(payload)
    first = post(client, "github", body, github_headers(body, "issues", "d-ign")).json()
    assert first == post(client, "github", body, github_headers(body, "issues", "d-ign")).json() == {
        "status": "ignored", "reason": "no-allowlisted-label"}
    assert Delivery.objects.count() == 2


def test_a_redelivery_while_another_process_holds_the_row_spools_a_copy_before_accepting(
        client, forges, label_rule, redis_conn):
    body = dumps(labelled(4))
    # Another web worker has stored this delivery (its first write waits for no fsync) and not settled it yet.
    Delivery.objects.create(forge="github", delivery_id="d-twice", event="issues", payload=body)

    response = post(client, "github", body, github_headers(body, "issues", "d-twice"))

    assert (response.status_code, response.json()) == (202, {"status": "accepted"})
    assert redis_conn.llen(intake.SPOOL_KEY) == 1 and queued(redis_conn) == []
    Delivery.objects.filter(delivery_id="d-twice").update(attempted_at=timezone.now() - timedelta(minutes=5))
    assert intake.replay_due().outcomes == {"queued": 1}  # the row is replayed once; the copy is dropped
    assert queued(redis_conn) == ["gh-d-twice"] and redis_conn.llen(intake.SPOOL_KEY) == 0


# --- the admin ------------------------------------------------------------------------------------------------

def test_admin_lists_by_status_and_replays_pending_deliveries(admin_client, client, forges, label_rule, settings,
                                                              redis_conn):
    real_url = settings.REDIS_URL
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    fleet_connection._client.cache_clear()
    deliver(client, 11, "d-adm-1")
    deliver(client, 12, "d-adm-2")
    settings.REDIS_URL = real_url
    fleet_connection._client.cache_clear()
    deliver(client, 13, "d-adm-3")

    listing = admin_client.get("/admin/receiver/delivery/?status__exact=pending").content.decode()
    assert "d-adm-1" in listing and "d-adm-2" in listing and "d-adm-3" not in listing
    found = admin_client.get("/admin/receiver/delivery/?q=gh-d-adm-3").content.decode()
    assert "d-adm-3" in found and "d-adm-1" not in found  # searchable by job id

    ids = list(Delivery.objects.values_list("pk", flat=True))
    page = admin_client.post("/admin/receiver/delivery/", {"action": "replay_selected", "_selected_action": ids},
                             follow=True).content.decode()

    assert "Replayed 2 delivery(ies): 2 queued." in page
    assert "1 delivery(ies) skipped: already settled" in page
    assert sorted(queued(redis_conn)) == ["gh-d-adm-1", "gh-d-adm-2", "gh-d-adm-3"]


def test_admin_discards_pending_deliveries(admin_client, client, forges, label_rule, redis_down):
    deliver(client, 21, "d-disc")
    pk = Delivery.objects.get().pk

    page = admin_client.post("/admin/receiver/delivery/", {"action": "discard_selected", "_selected_action": [pk]},
                             follow=True).content.decode()

    assert "1 delivery(ies) discarded" in page
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.payload) == (DeliveryStatus.DISCARDED, None)
    assert intake.replay(delivery) is None  # nothing left to replay


def test_admin_inbox_actions_need_the_change_permission(client, django_user_model, forges, label_rule, redis_down):
    from django.contrib.auth.models import Permission

    deliver(client, 31, "d-perm")
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_delivery"))
    client.force_login(viewer)

    page = client.get("/admin/receiver/delivery/").content.decode()

    assert "d-perm" in page and "replay_selected" not in page and "discard_selected" not in page


def test_process_leaves_no_text_in_the_inbox(client, forges, label_rule):
    deliver(client, 41, "d-clean")
    row = Delivery.objects.values().get()
    assert row["payload"] is None
    assert "Checkout" not in str(row) and "maintainer-mia" not in str(row)



# --- what log lines carry of a delivery id ------------------------------------------------------------------------

FORGING_ID = "d-1 forge=gitlab reason=self jobs=gh-other"  # a delivery id may hold spaces and `=`


def fields_of(line: str) -> list[str]:
    return [field.partition("=")[0] for field in line.split(" ")[1:]]


def test_delivery_ids_reach_log_lines_only_in_their_mapped_form(client, forges, label_rule, redis_down, caplog,
                                                                capsys, settings):
    """Spaces and `=` in an id could forge `key=value` fields: ids are logged as job ids carry them."""
    from django.core.management import call_command

    from apps.worker.jobs import delivery_part

    ignored = dumps({**labelled(7), "issue": {**labelled(7)["issue"], "labels": [{"name": "docs"}]}})
    unrouted = dumps({"action": "created", "issue": {"number": 3}, "sender": {"id": 1}})  # no repository: 400
    with caplog.at_level("INFO"):
        deliver(client, 7, FORGING_ID)  # Redis is down: pending
        deliver(client, 7, FORGING_ID)  # the forge sends it again
        post(client, "github", ignored, github_headers(ignored, "issues", FORGING_ID + " ignored=1"))
        post(client, "github", unrouted, github_headers(unrouted, "issue_comment", FORGING_ID + " rejected=1"))
        settings.REDIS_URL = os.environ["REDIS_URL"]
        fleet_connection._client.cache_clear()
        call_command("replay_deliveries", "--now")
        deliver(client, 7, "d-2 status=forged")  # swallowed by the dedup window

    lines = [record.getMessage() for record in caplog.records if record.name.startswith("pidispatch")]
    assert len(lines) >= 8
    for line in lines:
        assert len(fields_of(line)) == len(set(fields_of(line))), line
    assert f"delivery={delivery_part(FORGING_ID)} " in caplog.text
    for forged in ("forge=gitlab", "reason=self", "jobs=gh-other", "ignored=1", "rejected=1", "status=forged"):
        assert forged not in caplog.text
    replayed = capsys.readouterr().out
    assert f"github:{delivery_part(FORGING_ID)} queued" in replayed and FORGING_ID not in replayed
