"""Why a job waits: a deferral leaves a note (reason, until, detail, since) that `fleet status` and the
panel show; a second deferral keeps the first `since`; the note goes when the job runs or is cancelled."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from rq import Queue
from rq.registry import ScheduledJobRegistry

from apps.fleet import waiting
from apps.worker.models import Outcome, PauseWindow, Run
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def quiet_hours(minutes=30):
    now = datetime.now(UTC)
    return PauseWindow.objects.create(scope="acme/web",
                                      starts=(now - timedelta(minutes=1)).time().replace(second=0, microsecond=0),
                                      ends=(now + timedelta(minutes=minutes)).time().replace(second=0, microsecond=0),
                                      tz="UTC")


def wake_now(redis_conn, job_id):
    queue = Queue("pi-jobs", connection=redis_conn)
    ScheduledJobRegistry(queue=queue).schedule(queue.fetch_job(job_id), datetime.now(UTC) - timedelta(seconds=1))


def test_a_deferred_job_shows_why_it_waits_until_it_runs(run_worker, redis_conn, fleet_command):
    quiet_hours()
    enqueue_spec(forge_spec("gh-quiet-note", body="private words"), "pi-jobs")

    run_worker("pi-jobs")

    status = json.loads(fleet_command("status", "--json").stdout)
    (held,) = status["waiting"]
    assert (held["job_id"], held["queue"], held["kind"], held["reason"]) == \
        ("gh-quiet-note", "pi-jobs", "deferred", "pause-window")
    assert held["target"] == "acme/web#7" and "windowEnds" in held["detail"]
    assert held["until"] and held["since"]
    first_since = float(redis_conn.hget(waiting.note_key("gh-quiet-note"), "since"))
    text = fleet_command("status").stdout
    assert "gh-quiet-note" in text and "pause-window" in text and "private words" not in text

    wake_now(redis_conn, "gh-quiet-note")  # woken while the window still holds: deferred again
    run_worker("pi-jobs")
    assert float(redis_conn.hget(waiting.note_key("gh-quiet-note"), "since")) == first_since

    PauseWindow.objects.all().delete()
    wake_now(redis_conn, "gh-quiet-note")
    run_worker("pi-jobs")

    assert Run.objects.get(job_id="gh-quiet-note").outcome == Outcome.COMPLETED
    assert not redis_conn.exists(waiting.note_key("gh-quiet-note"))
    assert json.loads(fleet_command("status", "--json").stdout)["waiting"] == []


def test_a_retry_waiting_out_its_backoff_is_listed_as_such(redis_conn, run_worker, fleet_command):
    enqueue_spec(forge_spec("gh-flaky", body="fake-agent:exit=1"), "pi-jobs")

    run_worker("pi-jobs")

    (retry,) = json.loads(fleet_command("status", "--json").stdout)["waiting"]
    assert (retry["job_id"], retry["kind"], retry["reason"]) == ("gh-flaky", "retry", "retry-backoff")


def test_only_ids_names_numbers_and_instants_are_kept_in_the_detail():
    kept = waiting.clean_detail({
        "profile": "ci-green", "checks": 3, "ready": False, "windowEnds": "2026-12-01T09:00:00+00:00",
        "title": "Fix the login\nplease", "nested": {"a": 1}, "bad key!": 1, "email": "x<y>@z",
    })

    assert kept == {"profile": "ci-green", "checks": 3, "ready": False, "windowEnds": "2026-12-01T09:00:00+00:00"}


def test_held_jobs_lists_the_held_part_of_the_one_view(redis_conn):
    """`held_jobs` reads the wait notes `fleet status` shows: held and throttled jobs, longest held first,
    and no job deferred for any other reason."""
    now = datetime.now(UTC)
    queue = Queue("pi-jobs", connection=redis_conn)
    for job_id, reason, detail, waited in (
            ("gh-held", "wait-for", {"waitingOn": "profile ci-green", "checks": 2, "faults": 1}, 300),
            ("gh-throttled", "wait-throttled", {"waitingOn": "profile ci-green", "checks": 0, "denials": 3}, 900),
            ("gh-quiet", "pause-window", {"windowEnds": "06:00"}, 1200)):
        enqueue_spec(forge_spec(job_id), "pi-jobs")
        ScheduledJobRegistry(queue=queue).schedule(queue.fetch_job(job_id), now + timedelta(minutes=1))
        waiting.note(redis_conn, job_id, queue="pi-jobs", reason=reason, until=now + timedelta(minutes=1),
                     detail=detail, target="acme/web#7", since=now.timestamp() - waited)

    rows = waiting.held_jobs(redis_conn, ["pi-jobs"], now.timestamp())

    assert [(row["job_id"], row["held_seconds"], row["checks"], row["faults"], row["denials"]) for row in rows] == [
        ("gh-throttled", 900, 0, 0, 3), ("gh-held", 300, 2, 1, 0)]
    assert rows[1]["waiting_on"] == "profile ci-green" and rows[1]["queue"] == "pi-jobs"
    # RQ's whole seconds
    assert rows[1]["next_look_at"] == pytest.approx((now + timedelta(minutes=1)).timestamp(), abs=1)
    assert {job.job_id for job in waiting.list_waiting(redis_conn, ["pi-jobs"])} == {"gh-held", "gh-throttled",
                                                                                   "gh-quiet"}
