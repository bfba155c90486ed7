"""A repository's scoped `concurrent` holds across worker processes and hosts (deferral, never refusal); a
folder's never reaches past its own host, whose folder mutex serialises it; a crashed holder does not keep its
slot."""

import pytest

from apps.worker.gates import leases
from apps.worker.models import Outcome, Run, ScopedLimit
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec, local_spec
from tests.process_support import ContainerLifetimes, assert_no_overlap

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_one_never_overlaps_across_two_workers(start_worker):
    ScopedLimit.objects.create(scope="acme/web", concurrent=1)
    lifetimes = ContainerLifetimes()
    jobs = [enqueue_spec(forge_spec(f"gh-c{i}", number=10 + i, body="fake-agent:sleep=2")) for i in range(3)]

    for _ in range(2):
        start_worker("pi-jobs", env={"PI_SCOPE_BUSY_RECHECK_SECONDS": "1"})

    wait_for(lambda: Run.objects.count() == 3, timeout=120, interval=0.5, what="three runs")
    wait_for(lambda: len(lifetimes.intervals()) == 3, timeout=10, what="container events")
    lifetimes.close()
    assert set(Run.objects.values_list("outcome", flat=True)) == {Outcome.COMPLETED}
    assert set(lifetimes.intervals()) == set(jobs)
    assert_no_overlap(lifetimes.intervals())


def test_a_repositorys_concurrent_one_never_overlaps_across_two_hosts(start_worker):
    ScopedLimit.objects.create(scope="acme/web", concurrent=1)
    lifetimes = ContainerLifetimes()
    jobs = [enqueue_spec(forge_spec(f"gh-h{i}{host}", number=20 + i, body="fake-agent:sleep=2"), f"pi-jobs@{host}")
            for i in range(2) for host in ("hostA", "hostB")]

    for host in ("hostA", "hostB"):
        start_worker("pi-jobs", f"pi-jobs@{host}", env={"PI_WORKER_NAME": host, "PI_SCOPE_BUSY_RECHECK_SECONDS": "1"})

    wait_for(lambda: Run.objects.count() == 4, timeout=120, interval=0.5, what="four runs")
    wait_for(lambda: len(lifetimes.intervals()) == 4, timeout=10, what="container events")
    lifetimes.close()
    assert set(Run.objects.values_list("host", flat=True)) == {"hostA", "hostB"}
    assert set(lifetimes.intervals()) == set(jobs)
    assert_no_overlap(lifetimes.intervals())


def test_a_folders_concurrent_never_serialises_two_hosts(start_worker, repo):
    """`/srv/site` on two hosts is two repositories sharing a layout: a limit on the path bounds each host's
    folder, never both at once. (On this one machine both hosts' folder is the same one, which only makes the
    test stricter: nothing but the path's limit could keep the two apart.)"""
    ScopedLimit.objects.create(scope=str(repo), concurrent=1)
    lifetimes = ContainerLifetimes()
    for host in ("hostA", "hostB"):
        enqueue_spec(local_spec(f"run-site-{host}", str(repo), task="fake-agent:sleep=4", force=True),
                     f"pi-jobs@{host}")
        start_worker("pi-jobs", f"pi-jobs@{host}", env={"PI_WORKER_NAME": host, "PI_SCOPE_BUSY_RECHECK_SECONDS": "1"})

    wait_for(lambda: Run.objects.count() == 2, timeout=120, interval=0.5, what="two runs")
    wait_for(lambda: len(lifetimes.intervals()) == 2, timeout=10, what="container events")
    lifetimes.close()
    assert set(Run.objects.values_list("outcome", flat=True)) == {Outcome.COMPLETED}
    (a_start, a_end), (b_start, b_end) = (lifetimes.intervals()["run-site-hostA"],
                                          lifetimes.intervals()["run-site-hostB"])
    assert a_start < b_end and b_start < a_end  # the two hosts ran the folder at the same time


def test_other_scopes_are_not_held_back(start_worker):
    ScopedLimit.objects.create(scope="acme/web", concurrent=1)
    lifetimes = ContainerLifetimes()
    enqueue_spec(forge_spec("gh-web", body="fake-agent:sleep=3"))
    enqueue_spec(forge_spec("gh-api", repo="acme/api", body="fake-agent:sleep=3"))

    for _ in range(2):
        start_worker("pi-jobs", env={"PI_SCOPE_BUSY_RECHECK_SECONDS": "1"})

    wait_for(lambda: Run.objects.count() == 2, timeout=120, interval=0.5, what="two runs")
    wait_for(lambda: len(lifetimes.intervals()) == 2, timeout=10, what="container events")
    lifetimes.close()
    (web_start, web_end), (api_start, api_end) = lifetimes.intervals()["gh-web"], lifetimes.intervals()["gh-api"]
    assert web_start < api_end and api_start < web_end  # different scopes ran side by side


def test_a_slot_held_by_a_job_that_is_not_running_is_taken_over(redis_conn):
    taken = leases.acquire(redis_conn, "s:test", 1, "hostA#gh-crashed", ttl_seconds=3600)
    assert taken is not None

    # gh-crashed is not a running RQ job (its worker died): the slot is free for the next job.
    lease = leases.acquire(redis_conn, "s:test", 1, "hostB#gh-next", ttl_seconds=3600)
    assert lease is not None and redis_conn.get(lease.key) == b"hostB#gh-next"

    leases.release(redis_conn, taken)  # a late release by the old holder must not free the new one
    assert redis_conn.get(lease.key) == b"hostB#gh-next"


def test_a_slot_held_by_a_running_job_is_respected(redis_conn):
    from rq import Queue

    job = Queue("pi-jobs", connection=redis_conn).enqueue_call("tests.jobfuncs.defer_once", args=(1,), job_id="busy")
    job.set_status("started")
    assert leases.acquire(redis_conn, "s:test2", 1, "hostA#busy", ttl_seconds=3600)
    assert leases.acquire(redis_conn, "s:test2", 1, "hostB#other", ttl_seconds=3600) is None
