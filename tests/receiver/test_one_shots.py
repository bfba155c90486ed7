"""A one-shot rule is spent by the first run it caused (even a failed one): a later job from the same rule
is refused `once-already-spent` before any spend, unless the rule was re-armed after that run."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rq import Queue

from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rule():
    return Trigger.objects.create(position=0, kind="github", on_type="label", label_any=["pi"], flow="release")


def spent_by(rule, job_id, when):
    Run.objects.create(job_id=job_id, kind="github", target="acme/web#7", trigger=rule, started_at=when,
                       ended_at=when, outcome=Outcome.FAILED, reason="runner-infra")


def test_a_spent_rule_refuses_the_next_job(rule, run_worker):
    spent_by(rule, "gh-first", timezone.now() - timedelta(minutes=5))
    job_id = enqueue_spec(forge_spec("gh-second", trigger_id=rule.pk, once=True))

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "once-already-spent", False)


def test_a_rule_rearmed_after_its_run_fires_again(rule, run_worker):
    spent_by(rule, "gh-first", timezone.now() - timedelta(hours=1))
    armed = (timezone.now() - timedelta(minutes=1)).isoformat()
    job_id = enqueue_spec(forge_spec("gh-rearmed", trigger_id=rule.pk, once=True, once_armed_at=armed))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED


def test_the_spending_jobs_own_retry_is_excused(rule, run_worker, redis_conn):
    spent_by(rule, "gh-retrying", timezone.now() - timedelta(minutes=5))  # its first attempt failed
    job_id = enqueue_spec(forge_spec("gh-retrying", trigger_id=rule.pk, once=True))
    job = Queue("pi-jobs", connection=redis_conn).fetch_job(job_id)
    job.number_of_retries = 1  # this pickup is the retry
    job.save()

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id, attempt=2).outcome == Outcome.COMPLETED
