"""Pauses and drains outlive Redis (issue 48 §2): the database records each one, and a Redis that lost its data (it
came back empty, or from an older copy of its data) gets them back from that record before any worker takes a job.
A real worker against a private, persistent redis-server that the test empties and rolls back under it."""

import pytest
from rq import Queue

from apps.fleet import drains, pauses, state
from apps.fleet.connection import get_redis
from apps.fleet.models import HostDrain, QueuePause
from apps.worker.models import Outcome, Run
from tests.conftest import wait_for
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
