"""Cron triggers: fire on their pattern onto the host that holds the folder, no backfill, at most one
pending occurrence, exactly one job per occurrence across hosts, edits applied without a restart."""

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from rq import Queue

from apps.fleet.hosts import HostIdentity
from apps.receiver.cron import tick
from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db
HOST_A = HostIdentity("hostA", True)
T0 = datetime(2026, 3, 4, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
def schedule(tmp_path):
    def make(pattern="*/5 * * * *", folder=None, **fields):
        return Trigger.objects.create(position=0, on_type="cron", cron_id=fields.pop("cron_id", "nightly"),
                                      cron_pattern=pattern, kind="local", folder=str(folder or tmp_path),
                                      flow="tidy", task="Tidy up.", **fields)
    return make


def host_jobs(redis_conn, host="hostA"):
    return Queue(f"pi-jobs@{host}", connection=redis_conn).get_job_ids()


def test_a_new_schedule_waits_for_its_next_occurrence(redis_conn, schedule):
    trigger = schedule()
    assert tick(redis_conn, HOST_A, T0).fired == []  # 12:00 is in the past for a trigger first seen now

    result = tick(redis_conn, HOST_A, T0 + timedelta(minutes=5))

    stamp = int(datetime(2026, 3, 4, 12, 5, tzinfo=UTC).timestamp())
    assert result.fired == [f"cron-{trigger.pk}-{stamp}"]
    assert host_jobs(redis_conn) == result.fired
    job = Queue("pi-jobs@hostA", connection=redis_conn).fetch_job(result.fired[0])
    spec = job.args[0]
    assert (spec["kind"], spec["trigger_type"], spec["flow"], spec["task"]) == ("local", "cron", "tidy", "Tidy up.")
    assert tick(redis_conn, HOST_A, T0 + timedelta(minutes=5, seconds=20)).fired == []  # once per occurrence


def test_downtime_fires_only_the_latest_missed_occurrence(redis_conn, schedule):
    schedule()
    tick(redis_conn, HOST_A, T0)
    result = tick(redis_conn, HOST_A, T0 + timedelta(hours=3))  # 36 occurrences were missed
    assert len(result.fired) == 1 and result.fired[0].endswith(
        str(int(datetime(2026, 3, 4, 15, 0, tzinfo=UTC).timestamp())))


def test_at_most_one_pending_occurrence(redis_conn, schedule):
    schedule()
    tick(redis_conn, HOST_A, T0)
    first = tick(redis_conn, HOST_A, T0 + timedelta(minutes=5)).fired
    second = tick(redis_conn, HOST_A, T0 + timedelta(minutes=10))  # nobody ran the first one yet

    assert second.fired == [] and second.skipped == ["nightly"]
    assert host_jobs(redis_conn) == first


def test_a_folder_on_another_host_is_not_fired_here(redis_conn, schedule, tmp_path):
    schedule(folder=tmp_path / "not-here")
    tick(redis_conn, HOST_A, T0)
    assert tick(redis_conn, HOST_A, T0 + timedelta(minutes=5)).fired == []


def test_two_hosts_holding_the_folder_make_one_job(redis_conn, schedule):
    schedule()
    tick(redis_conn, HOST_A, T0)
    later = T0 + timedelta(minutes=5)
    fired = tick(redis_conn, HOST_A, later).fired + tick(redis_conn, HostIdentity("hostB", True), later).fired
    assert len(fired) == 1
    assert len(host_jobs(redis_conn, "hostA")) + len(host_jobs(redis_conn, "hostB")) == 1


def test_edits_apply_on_the_next_tick(redis_conn, schedule):
    trigger = schedule()
    tick(redis_conn, HOST_A, T0)
    trigger.enabled = False
    trigger.save()
    assert tick(redis_conn, HOST_A, T0 + timedelta(minutes=5)).fired == []
    trigger.enabled, trigger.cron_pattern = True, "0 * * * *"
    trigger.save()
    assert tick(redis_conn, HOST_A, T0 + timedelta(minutes=10)).fired == []  # hourly now: 12:00 was handled
    assert len(tick(redis_conn, HOST_A, T0 + timedelta(hours=1)).fired) == 1


def test_six_fields_put_the_seconds_first(redis_conn, schedule):
    schedule(pattern="*/20 * * * * *")
    tick(redis_conn, HOST_A, T0)
    result = tick(redis_conn, HOST_A, T0 + timedelta(seconds=15))
    assert result.fired and result.fired[0].endswith(str(int((T0 + timedelta(seconds=10)).timestamp())))


def test_an_undeclared_host_uses_the_shared_queue(redis_conn, schedule):
    schedule()
    tick(redis_conn, HostIdentity("box", False), T0)
    fired = tick(redis_conn, HostIdentity("box", False), T0 + timedelta(minutes=5)).fired
    assert Queue("pi-jobs", connection=redis_conn).get_job_ids() == fired


@pytest.mark.django_db(transaction=True)
def test_run_cron_and_a_worker_run_the_schedule(repo, schedule, worker_env, run_worker):  # noqa: F811
    trigger = schedule(pattern="* * * * * *", folder=repo)  # every second
    env = {**worker_env, "PI_WORKER_NAME": "hostA"}
    command = [sys.executable, "manage.py", "run_cron", "--once"]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)  # first sight
    time.sleep(1.2)
    fired = subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout

    assert fired.startswith(f"fired cron-{trigger.pk}-")
    run_worker("pi-jobs", "pi-jobs@hostA", env_overrides={"PI_WORKER_NAME": "hostA"})
    run = Run.objects.get(trigger=trigger)
    assert (run.outcome, run.trigger_type, run.target, run.host) == (Outcome.COMPLETED, "cron", "local:app", "hostA")


def test_an_occurrence_whose_enqueue_failed_fires_on_the_next_tick(redis_conn, schedule, monkeypatch):
    from redis.exceptions import ConnectionError as RedisConnectionError

    from apps.receiver import cron

    schedule()
    tick(redis_conn, HOST_A, T0)
    real_enqueue = cron.enqueue

    def flaky(spec, queue):
        monkeypatch.setattr(cron, "enqueue", real_enqueue)
        raise RedisConnectionError("connection reset")

    monkeypatch.setattr(cron, "enqueue", flaky)
    with pytest.raises(RedisConnectionError):
        tick(redis_conn, HOST_A, T0 + timedelta(minutes=5))

    assert len(tick(redis_conn, HOST_A, T0 + timedelta(minutes=5, seconds=1)).fired) == 1


@pytest.mark.django_db(transaction=True)
def test_a_cron_jobs_event_json_names_its_trigger_pattern_previous_run_and_head(
        repo, schedule, redis_conn, run_worker, settings):
    """Occurrences fired by ticks at chosen instants (no waiting for the clock), run by a real worker."""
    import json

    trigger = schedule(pattern="* * * * * *", folder=repo, cron_id="tidy-nightly")
    head = subprocess.run(["git", "-c", f"safe.directory={repo}", "-C", str(repo), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    worker = {"PI_WORKER_NAME": "hostA"}

    def fire_and_run(instant) -> tuple[str, dict]:
        (job_id,) = tick(redis_conn, HOST_A, instant).fired
        run_worker("pi-jobs@hostA", env_overrides=worker)
        run = Run.objects.get(job_id=job_id)
        assert run.outcome == Outcome.COMPLETED, run.reason
        (repo / "pi-output.md").unlink(missing_ok=True)  # what the demo agent wrote: the next run finds it clean
        return job_id, json.loads((settings.PI_JOB_ROOT / job_id / "job" / "event.json").read_text())

    def occurrence(job_id: str) -> str:
        return datetime.fromtimestamp(int(job_id.rsplit("-", 1)[1]), UTC).isoformat()

    tick(redis_conn, HOST_A, T0)  # first sight: remembered, not fired
    first_id, first = fire_and_run(T0 + timedelta(seconds=1))
    assert first["cron"] == {"id": "tidy-nightly", "pattern": "* * * * * *", "scheduledFor": occurrence(first_id),
                             "previousRunAt": None, "head": head}
    assert first["previousRunAt"] is None and first["trigger"]["event"] == "cron"
    assert first_id.startswith(f"cron-{trigger.pk}-")

    second_id, second = fire_and_run(T0 + timedelta(seconds=2))
    assert second_id != first_id and second["cron"]["scheduledFor"] == occurrence(second_id)
    previous = Run.objects.get(job_id=first_id)
    assert second["cron"]["previousRunAt"] == second["previousRunAt"] == previous.ended_at.isoformat()
    assert second["cron"]["head"] == head and second["cron"]["pattern"] == "* * * * * *"


def test_a_redis_that_lost_its_data_neither_fires_an_occurrence_twice_nor_skips_the_next(redis_conn, schedule):
    """The last occurrence handled is Redis's; lost, it is read from the database's record of the trigger's jobs."""
    trigger = schedule()
    tick(redis_conn, HOST_A, T0)
    fired = tick(redis_conn, HOST_A, T0 + timedelta(minutes=5)).fired
    assert len(fired) == 1

    redis_conn.flushdb()  # Redis came back empty
    assert tick(redis_conn, HOST_A, T0 + timedelta(minutes=6)).fired == []  # 12:05 was fired before the loss
    redis_conn.flushdb()  # and again, its next tick at the next occurrence: that one is not taken for a first sight
    stamp = int(datetime(2026, 3, 4, 12, 10, tzinfo=UTC).timestamp())
    assert tick(redis_conn, HOST_A, T0 + timedelta(minutes=10)).fired == [f"cron-{trigger.pk}-{stamp}"]
