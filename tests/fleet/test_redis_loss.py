"""Accepted jobs, pauses and drains outlive Redis (issue 48 §1, §2): the database records each one, and a Redis that
lost its data (it came back empty, or from an older copy of its data) gets them back from that record before any
worker takes a job. Real workers and the real replayer against a private, persistent redis-server that the test
empties and rolls back under them."""

import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone
from rq import Queue
from rq.job import Job

from apps.fleet import drains, pauses, state
from apps.fleet.connection import get_redis
from apps.fleet.models import HostDrain, QueuePause
from apps.worker import accepted
from apps.worker.jobs import job_time_budget_seconds
from apps.worker.models import AcceptedJob, JobsRebuilt, Outcome, Run
from tests.conftest import ROOT, wait_for
from tests.jobspecs import enqueue_spec, forge_spec
from tests.process_support import PrivateRedis

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

HOST = {"PI_WORKER_NAME": "hostA"}


@pytest.fixture
def private_redis(tmp_path, settings):
    redis = PrivateRedis(tmp_path / "redis")
    settings.REDIS_URL = redis.url  # the test pauses, enqueues and reads there too
    yield redis
    redis.stop()


def ran(job_id: str) -> bool:
    return Run.objects.filter(job_id=job_id, outcome=Outcome.COMPLETED).exists()


def restores(worker) -> int:
    return worker.output().count("fleet_state_restored")


def test_a_pause_outlives_a_redis_that_came_back_empty_or_from_an_older_copy(private_redis, start_worker, tmp_path,
                                                                             fast_fleet):
    worker = start_worker("pi-jobs", "pi-jobs@hostA", env={**HOST, "REDIS_URL": private_redis.url})
    wait_for(lambda: restores(worker) == 1, timeout=60, what="the worker to restore the record into a new Redis")
    # An older copy of Redis's data: from before the pause, with the marker of a Redis process gone by now.
    private_redis.stop()
    private_redis.copy_data(tmp_path / "older")
    private_redis.start()
    wait_for(lambda: restores(worker) == 2, timeout=30, what="the worker to see a Redis it has not restored into")

    result = pauses.pause(get_redis(), ["pi-jobs"], by="ops", note="incident 42")
    assert result.changed == ["pi-jobs"] and not result.record_error
    assert QueuePause.objects.get(queue="pi-jobs").note == "incident 42"

    for lost, data in (("empty", None), ("older copy", tmp_path / "older")):
        before = restores(worker)
        private_redis.restart_with(data)
        held = enqueue_spec(forge_spec(f"gh-held-{lost.replace(' ', '-')}"), "pi-jobs")
        wait_for(lambda before=before: restores(worker) > before, timeout=30,
                 what=f"the worker to restore the record into a Redis that came back {lost}")
        # The worker takes from its other queue meanwhile: it looked at the paused one, and left its job there.
        beside = enqueue_spec(forge_spec(f"gh-beside-{lost.replace(' ', '-')}"), "pi-jobs@hostA")
        wait_for(lambda beside=beside: ran(beside), timeout=120, what=f"the unpaused queue's job ({lost})")
        assert not Run.objects.filter(job_id=held).exists(), f"a paused queue's job ran after Redis came back {lost}"
        assert held in Queue("pi-jobs", connection=get_redis()).job_ids
        assert pauses.read_flags(get_redis())["pi-jobs"].note == "incident 42"

    pauses.resume(get_redis(), ["pi-jobs"], by="ops")
    assert not QueuePause.objects.exists()
    wait_for(lambda: ran("gh-held-older-copy"), timeout=120, what="the held job to run once the queue is resumed")
    assert Run.objects.filter(job_id="gh-held-older-copy").count() == 1


def test_a_drain_outlives_a_redis_that_came_back_empty(private_redis, start_worker, fast_fleet):
    worker = start_worker("pi-jobs", "pi-jobs@hostA", env={**HOST, "REDIS_URL": private_redis.url})
    wait_for(lambda: restores(worker) == 1, timeout=60, what="the worker to restore the record into a new Redis")
    assert drains.drain(get_redis(), "hostA", by="ops", note="kernel update") == ""
    assert HostDrain.objects.get(host="hostA").note == "kernel update"

    private_redis.restart_with(None)
    held = enqueue_spec(forge_spec("gh-drained"), "pi-jobs@hostA")
    wait_for(lambda: restores(worker) == 2, timeout=30, what="the worker to restore the record")

    assert drains.is_drained(get_redis(), "hostA")
    assert held in Queue("pi-jobs@hostA", connection=get_redis()).job_ids and not Run.objects.exists()
    was, _ = drains.undrain(get_redis(), "hostA", by="ops")
    assert was and not HostDrain.objects.exists()
    wait_for(lambda: ran(held), timeout=120, what="the job once the host is undrained")


def test_without_the_record_a_redis_that_lost_its_data_serves_no_job(private_redis, monkeypatch):
    """A worker that cannot tell whether a queue is paused does not take from it (the database away: the one
    stand-in, a failing query)."""
    from django.db import DatabaseError

    def unavailable(*args, **kwargs):
        raise DatabaseError("the database is away")

    monkeypatch.setattr(QueuePause.objects, "all", unavailable)
    redis = get_redis()
    with pytest.raises(state.StateUnknown):
        state.ensure_restored(redis)
    assert redis.get(state.RESTORED) is None  # and it tries again on the next turn


def test_a_cancel_request_outlives_a_redis_that_lost_its_data(private_redis, settings):
    """The ladder's first gate and the worker's retry policy ask for it: a job an operator stopped stays stopped."""
    from apps.fleet import cancel
    from apps.fleet.models import CancelRequest

    redis = get_redis()
    job_id = enqueue_spec(forge_spec("gh-cancelled"), "pi-jobs")
    assert cancel.cancel_job(redis, job_id, by="ops").outcome == "removed"
    assert CancelRequest.objects.get(job_id=job_id).by == "ops"

    private_redis.restart_with(None)
    assert not cancel.is_cancel_requested(job_id, redis)
    assert state.ensure_restored(redis) and not state.ensure_restored(redis)  # once per Redis process

    assert cancel.is_cancel_requested(job_id, redis)
    assert 0 < redis.ttl(cancel.request_key(job_id)) <= settings.PI_FLEET_CANCEL_TTL_SECONDS


def replay_once(worker_env, redis_url) -> subprocess.CompletedProcess:
    """`manage.py replay_deliveries`, one pass, as an operator (or the replayer's loop) runs it."""
    return subprocess.run([sys.executable, "manage.py", "replay_deliveries"], cwd=ROOT,
                          env={**worker_env, "REDIS_URL": redis_url}, capture_output=True, text=True, timeout=60)


def completed_runs(job_id: str) -> int:
    return Run.objects.filter(job_id=job_id, outcome=Outcome.COMPLETED).count()


def test_jobs_accepted_while_no_worker_listened_outlive_a_redis_that_came_back_empty(
        private_redis, worker_env, run_worker, client, settings):
    shared = enqueue_spec(forge_spec("gh-accepted-shared", body="secret issue text"), "pi-jobs")
    own = enqueue_spec(forge_spec("gh-accepted-own"), "pi-jobs@hostA")
    assert AcceptedJob.objects.get(job_id=shared).payload["body"] == "secret issue text"

    private_redis.restart_with(None)  # nobody had taken them: Redis alone held them, and it forgot
    assert not get_redis().exists(Job.key_for(shared))

    replayed = replay_once(worker_env, private_redis.url)
    assert "Redis had lost 2 accepted job(s): queued again under their ids" in replayed.stderr, replayed.stderr
    assert (Queue("pi-jobs", connection=get_redis()).job_ids, Queue("pi-jobs@hostA", connection=get_redis()).job_ids
            ) == ([shared], [own])
    assert list(JobsRebuilt.objects.values_list("jobs", flat=True)) == [2]

    run_worker("pi-jobs", "pi-jobs@hostA", env_overrides={**HOST, "REDIS_URL": private_redis.url})
    assert (completed_runs(shared), completed_runs(own)) == (1, 1)
    row = AcceptedJob.objects.get(job_id=shared)
    assert row.settled_at is not None and row.payload is None and row.rebuilt == 1  # its texts went with the job

    again = replay_once(worker_env, private_redis.url)
    assert "lost" not in again.stderr and JobsRebuilt.objects.count() == 1  # settled jobs are not queued again
    settings.PI_METRICS_TOKEN = ""
    assert "pidispatch_jobs_rebuilt_total 2.0" in client.get("/metrics").content.decode()


def test_a_job_that_ran_since_an_older_copy_of_redis_runs_once(private_redis, worker_env, run_worker, tmp_path):
    """The older copy still queues a job that has run since, and lacks one accepted after it: the first is skipped by
    the worker (its record exists), the second is queued again; each runs exactly once."""
    ran_since = enqueue_spec(forge_spec("gh-ran-since"), "pi-jobs")
    private_redis.stop()
    private_redis.copy_data(tmp_path / "older")
    private_redis.start()
    run_worker("pi-jobs", env_overrides={**HOST, "REDIS_URL": private_redis.url})
    assert completed_runs(ran_since) == 1
    accepted_after = enqueue_spec(forge_spec("gh-accepted-after"), "pi-jobs")

    private_redis.restart_with(tmp_path / "older")
    assert Queue("pi-jobs", connection=get_redis()).job_ids == [ran_since]
    replayed = replay_once(worker_env, private_redis.url)
    assert "Redis had lost 1 accepted job(s)" in replayed.stderr, replayed.stderr

    worker = run_worker("pi-jobs", env_overrides={**HOST, "REDIS_URL": private_redis.url})
    assert (completed_runs(ran_since), completed_runs(accepted_after)) == (1, 1)
    assert Run.objects.filter(job_id=ran_since).count() == 1
    assert f"job_skipped job={ran_since} attempt=1 why=already-run" in worker.stdout + worker.stderr


def test_the_reconciler_reads_the_run_records_before_it_queues_anything(private_redis):
    """Per open row whose job Redis lost: an attempt recorded as the job's end settles it; an attempt started and not
    recorded may still run on a worker that lost Redis with it, so it waits out that attempt's time budget; a failed
    attempt with retries left comes back as the next attempt."""
    redis = get_redis()
    now = timezone.now()
    for job_id in ("gh-done", "gh-running", "gh-long-gone", "gh-to-retry"):
        enqueue_spec(forge_spec(job_id), "pi-jobs")
    Run.objects.create(job_id="gh-done", attempt=1, kind="github", started_at=now, ended_at=now,
                       outcome=Outcome.COMPLETED)
    Run.objects.create(job_id="gh-to-retry", attempt=1, kind="github", started_at=now, ended_at=now,
                       outcome=Outcome.FAILED, reason="forge-unavailable")
    accepted.started("gh-running", 1)
    accepted.started("gh-long-gone", 1)
    AcceptedJob.objects.filter(job_id="gh-long-gone").update(
        started_at=now - timedelta(seconds=job_time_budget_seconds() + 60))
    private_redis.restart_with(None)

    assert accepted.reconcile(redis) == 2
    assert set(Queue("pi-jobs", connection=redis).job_ids) == {"gh-long-gone", "gh-to-retry"}
    assert Job.fetch("gh-to-retry", connection=redis).number_of_retries == 1  # it runs as attempt 2
    assert AcceptedJob.objects.get(job_id="gh-done").settled_at is not None
    assert AcceptedJob.objects.get(job_id="gh-running").settled_at is None  # still open: looked at again later
    assert accepted.reconcile_if_redis_changed(redis) is None  # this Redis is reconciled with already


def outcomes(job_ids) -> list[tuple[str, str]]:
    return [Run.objects.values_list("outcome", "reason").get(job_id=job_id) for job_id in job_ids]


def test_a_job_cap_counts_what_was_spent_before_redis_came_back_empty(private_redis, run_worker):
    """The issue's own trial: a daily cap of 6 jobs with 4 spent lets 2 more run after Redis restarted empty, not 6."""
    env = {**HOST, "REDIS_URL": private_redis.url, "PI_DAILY_CAP": "6"}
    before = [enqueue_spec(forge_spec(f"gh-before-{n}"), "pi-jobs") for n in range(4)]
    run_worker("pi-jobs", env_overrides=env)
    assert outcomes(before) == [("completed", "")] * 4

    private_redis.restart_with(None)
    after = [enqueue_spec(forge_spec(f"gh-after-{n}"), "pi-jobs") for n in range(4)]
    worker = run_worker("pi-jobs", env_overrides=env)

    assert outcomes(after) == [("completed", "")] * 2 + [("policy", "over-budget")] * 2
    assert "budget_rebuilt" in worker.stdout + worker.stderr


def test_a_dollar_cap_counts_what_was_spent_before_redis_came_back_from_an_older_copy(private_redis, run_worker,
                                                                                      tmp_path):
    """$1 held and charged whole per job (the stand-in agent reports no cost), $3 a day: one job spent before the
    copy was taken and one after; the older copy remembers one dollar, the records two, so one more job fits."""
    env = {**HOST, "REDIS_URL": private_redis.url, "PI_MAX_COST_USD": "1", "PI_DAILY_COST_USD": "3"}
    first = enqueue_spec(forge_spec("gh-dollar-1"), "pi-jobs")
    run_worker("pi-jobs", env_overrides=env)
    private_redis.stop()
    private_redis.copy_data(tmp_path / "older")
    private_redis.start()
    second = enqueue_spec(forge_spec("gh-dollar-2"), "pi-jobs")
    run_worker("pi-jobs", env_overrides=env)
    assert outcomes([first, second]) == [("completed", "")] * 2

    private_redis.restart_with(tmp_path / "older")
    after = [enqueue_spec(forge_spec(f"gh-dollar-after-{n}"), "pi-jobs") for n in range(2)]
    run_worker("pi-jobs", env_overrides=env)

    assert outcomes(after) == [("completed", ""), ("policy", "dollar-cap")]
