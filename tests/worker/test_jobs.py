"""The job contract: job ids, the JobSpec payload, and what a worker does with one it cannot read."""

import re

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rq import Queue

from apps.worker.jobs import (
    JOB_FUNCTION,
    JOB_ID_PATTERN,
    Claim,
    JobSpec,
    JobSpecError,
    delivery_job_id,
    enqueue,
    job_time_budget_seconds,
)
from apps.worker.models import Outcome, Run


def test_delivery_job_ids_use_the_forge_prefixes():
    assert delivery_job_id("github", "72d3162e-cc78-11e3") == "gh-72d3162e-cc78-11e3"
    assert delivery_job_id("gitlab", "abc") == "gl-abc"
    assert delivery_job_id("forgejo", "abc") == "fj-abc"
    assert delivery_job_id("azure", "abc", replica=2) == "az-abc-r2"


@pytest.mark.parametrize("raw", ["a.b", "a b", "ü", "x" * 300, "a/b:c"])
def test_unsafe_delivery_ids_map_deterministically_and_do_not_collide(raw):
    mapped = delivery_job_id("gitlab", raw)
    assert JOB_ID_PATTERN.fullmatch(mapped)
    assert mapped == delivery_job_id("gitlab", raw)
    assert len(mapped) < 120


def test_similar_unsafe_ids_stay_distinct():
    assert delivery_job_id("gitlab", "a.b") != delivery_job_id("gitlab", "a_b")
    assert delivery_job_id("gitlab", "a.b") != delivery_job_id("gitlab", "a:b")


def test_ordinary_delivery_ids_are_kept_as_they_are():
    for delivery in ("72d3162e-cc78-11e3-81ab-4c9367dc0958", "poll-e123", "poll-pr12-6dcb09b", "d-r", "r1", "a-rb1"):
        assert delivery_job_id("github", delivery) == f"gh-{delivery}"


def test_a_delivery_id_cannot_fake_a_replica_suffix():
    assert delivery_job_id("github", "abc", replica=1) != delivery_job_id("github", "abc-r1")
    assert delivery_job_id("github", "abc-r1", replica=2) != delivery_job_id("github", "abc-r1-r2")
    assert JOB_ID_PATTERN.fullmatch(delivery_job_id("github", "abc-r1"))
    assert not re.search(r"-r\d+$", delivery_job_id("github", "abc-r1"))


def test_a_delivery_id_cannot_be_another_ids_mapped_form():
    mapped = delivery_job_id("gitlab", "a.b")
    assert delivery_job_id("gitlab", mapped.removeprefix("gl-")) != mapped


delivery_ids = st.text(alphabet="ab1-r_.:", min_size=1, max_size=10) | st.text(min_size=1, max_size=100)
replicas = st.none() | st.integers(1, 12)


@hypothesis_settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(delivery=delivery_ids, replica=replicas, other=delivery_ids, other_replica=replicas)
def test_no_delivery_id_produces_another_deliverys_job_id(delivery, replica, other, other_replica):
    job_id = delivery_job_id("github", delivery, replica)
    assert JOB_ID_PATTERN.fullmatch(job_id)
    # Another delivery whose id is this job id's tail, or anything else, with or without replicas.
    for candidate, candidate_replica in ((job_id.removeprefix("gh-"), None), (job_id.removeprefix("gh-"), 1),
                                         (other, other_replica)):
        if (candidate, candidate_replica) != (delivery, replica):
            assert delivery_job_id("github", candidate, candidate_replica) != job_id


@pytest.mark.parametrize("kind, delivery, replica", [("svn", "x", None), ("github", "", None), ("github", "x", 0)])
def test_bad_job_id_inputs_raise(kind, delivery, replica):
    with pytest.raises(ValueError):
        delivery_job_id(kind, delivery, replica)


def test_spec_round_trips_and_names_its_target():
    spec = JobSpec(job_id="gl-1", kind="gitlab", repo="group/sub/proj", target_type="pull_request", number=5,
                   flow="fix", title="t", body="b")

    assert JobSpec.from_payload(spec.to_payload()) == spec
    assert spec.target == "group/sub/proj!5"
    assert JobSpec(job_id="gh-1", kind="github", repo="o/r", target_type="pull_request", number=5,
                   flow="f").target == "o/r#5"
    assert JobSpec(job_id="run-1", kind="local", folder="/srv/code/app", target_type="local",
                   task="x", flow="f").target == "local:app"


def issue_spec(job_id: str) -> JobSpec:
    return JobSpec(job_id=job_id, kind="github", repo="acme/web", target_type="issue", number=7, flow="fix",
                   body="text", context={"matched": {"label": "pi"}}, exclude_tools=("bash",))


@pytest.mark.django_db  # enqueue stamps the job's project (a database read)
def test_enqueue_writes_the_job_exactly_as_rqs_own_unique_enqueue_does(redis_conn, settings):
    """Our enqueue is one Lua script writing RQ's keys itself; an RQ upgrade that changes them fails here."""
    from rq.job import Job

    assert enqueue(issue_spec("gh-ours"), "pi-jobs").created
    Queue("pi-jobs", connection=redis_conn).enqueue_call(
        JOB_FUNCTION, args=(issue_spec("gh-theirs").to_payload(),), job_id="gh-theirs", unique=True,
        description="gh-theirs", timeout=job_time_budget_seconds(), result_ttl=settings.PI_FINISHED_JOB_TTL_SECONDS,
        failure_ttl=settings.PI_FAILED_JOB_TTL_SECONDS)

    ours, theirs = redis_conn.hgetall("rq:job:gh-ours"), redis_conn.hgetall("rq:job:gh-theirs")
    assert set(ours) == set(theirs)
    differing = {field for field in ours if ours[field] != theirs[field]}
    assert differing <= {b"description", b"data", b"created_at", b"enqueued_at"}
    assert redis_conn.ttl("rq:job:gh-ours") == redis_conn.ttl("rq:job:gh-theirs") == -1
    assert Queue("pi-jobs", connection=redis_conn).get_job_ids() == ["gh-ours", "gh-theirs"]
    assert b"rq:queue:pi-jobs" in redis_conn.smembers("rq:queues")
    job = Job.fetch("gh-ours", connection=redis_conn)
    assert (job.func_name, job.get_status()) == (JOB_FUNCTION, "queued")
    assert job.args == (issue_spec("gh-ours").to_payload(),)


@pytest.mark.django_db  # enqueue stamps the job's project (a database read)
def test_enqueue_is_unique_on_the_job_id_and_on_its_claim(redis_conn):
    claim = Claim("pidispatch:dedup:github:acme/web#7:fix", 60_000, "dedup-window")

    first = enqueue(issue_spec("gh-a"), "pi-jobs", (claim,))
    again = enqueue(issue_spec("gh-a"), "pi-jobs", (claim,))  # the same delivery retried passes its own claim
    other = enqueue(issue_spec("gh-b"), "pi-jobs", (claim,))

    assert (first.status, again.status, other.status, other.surviving) == ("created", "existing", "swallowed", "gh-a")
    assert other.claim == claim
    assert Queue("pi-jobs", connection=redis_conn).get_job_ids() == ["gh-a"]
    assert 0 < redis_conn.pttl(claim.key) <= 60_000
    redis_conn.delete(claim.key)  # the window is over
    assert enqueue(issue_spec("gh-b"), "pi-jobs", (claim,)).created
    assert redis_conn.get(claim.key) == b"gh-b"


@pytest.mark.django_db  # enqueue stamps the job's project (a database read)
def test_a_job_swallowed_by_one_claim_takes_none_of_the_others(redis_conn):
    replay = Claim("pidispatch:replay:github:abc", 60_000, "replayed-body")
    free = Claim("pidispatch:dedup:github:acme/web#7:fix", 60_000, "dedup-window")
    assert enqueue(issue_spec("gh-first"), "pi-jobs", (replay,)).created

    swallowed = enqueue(issue_spec("gh-second"), "pi-jobs", (free, replay))

    assert (swallowed.status, swallowed.surviving, swallowed.claim) == ("swallowed", "gh-first", replay)
    assert not redis_conn.exists(free.key)  # a later delivery for the target is not swallowed by a non-job
    # A claim's holder may be another job of the same delivery (its replicas share one).
    shared = Claim("pidispatch:replay:github:def", 60_000, "replayed-body", holder="gh-d-r1")
    assert enqueue(issue_spec("gh-d-r1"), "pi-jobs", (shared,)).created
    assert enqueue(issue_spec("gh-d-r2"), "pi-jobs", (shared,)).created
    assert redis_conn.get(shared.key) == b"gh-d-r1"


@pytest.mark.parametrize(
    "payload",
    [
        {"job_id": "gh-1", "kind": "github", "flow": "f", "version": 2},
        {"job_id": "gh-1", "kind": "github", "flow": "f", "version": 1, "surprise": True},
        {"job_id": "gh 1", "kind": "github", "flow": "f", "version": 1},
        {"job_id": "gh-1", "kind": "svn", "flow": "f", "version": 1},
        {"job_id": "gh-1", "kind": "github", "version": 1},
        {"job_id": "gh-1", "kind": "github", "flow": "f", "command": "c", "version": 1},
        {"kind": "github", "flow": "f", "version": 1},
        ["not", "a", "dict"],
    ],
)
def test_unreadable_payloads_are_refused(payload):
    with pytest.raises(JobSpecError):
        JobSpec.from_payload(payload)


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_a_worker_records_a_payload_it_cannot_read_and_does_not_retry_it(run_worker, redis_conn):
    Queue("pi-jobs", connection=redis_conn).enqueue_call(
        JOB_FUNCTION, args=({"job_id": "gh-skew", "kind": "github", "flow": "f", "version": 99},), job_id="gh-skew"
    )

    run_worker("pi-jobs")

    run = Run.objects.get(job_id="gh-skew")
    assert (run.outcome, run.reason, run.attempt) == (Outcome.POLICY, "job-payload-invalid", 1)


@pytest.mark.django_db(transaction=True)
def test_a_record_is_written_once_per_attempt_and_survives_a_deleted_trigger():
    from apps.receiver.models import Trigger
    from apps.worker.gates.verdicts import Verdict
    from apps.worker.records import record_run

    trigger = Trigger.objects.create(position=0, kind="github", on_type="label", label_any=["pi"], flow="f")
    spec = JobSpec(job_id="gh-once", kind="github", repo="o/r", target_type="issue", number=1, flow="f",
                   trigger_id=trigger.pk, trigger_type="label")
    trigger.delete()  # deleted while its job waited in the queue

    first = record_run(spec, Verdict(outcome=Outcome.COMPLETED), attempt=1, host="h", queue="pi-jobs")
    second = record_run(spec, Verdict(outcome=Outcome.FAILED, reason="worker-lost"), attempt=1, host="h",
                        queue="pi-jobs")

    assert (first.pk, second.outcome) == (second.pk, Outcome.COMPLETED)  # the first record stands
    assert (first.trigger_id, first.trigger_type) == (None, "label")
    assert Run.objects.filter(job_id="gh-once").count() == 1
