"""One-shot close rules: a real worker runs the job, the run record disarms the rule, a re-arm lets it fire
once more, and a job from before the re-arming cannot spend the new arming."""

import pytest

from apps.receiver import triggers
from apps.receiver.models import Trigger
from apps.worker.jobs import JobSpec
from apps.worker.models import Run
from tests.receiver_support import dumps, github_headers, job_spec, load, post, rule


def close_issue(client, delivery, number=7):
    payload = load("github/issues_labeled.json")
    payload["action"] = "closed"
    payload["issue"]["number"] = number
    payload["sender"].update(id=6600123, login="closer-carl")
    payload["issue"]["closed_at"] = f"2026-11-29T12:00:0{delivery[-1]}Z"  # every close is its own (a new body)
    body = dumps(payload)
    return post(client, "github", body, github_headers(body, "issues", delivery)).json()


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_a_one_shot_fires_once_disarms_after_its_run_and_fires_again_when_rearmed(client, forges, redis_conn,
                                                                                  run_worker):
    forges.github_permission("acme/web", "closer-carl", "write")
    one_shot = rule(position=0, kind="github", on_type="issue", actions=["closed"], number=7, once=True, flow="retro")

    assert close_issue(client, "d-close-1") == {"status": "queued", "jobs": ["gh-d-close-1"]}
    run_worker("pi-jobs")

    run = Run.objects.get(job_id="gh-d-close-1")
    one_shot.refresh_from_db()
    assert run.trigger_id == one_shot.pk
    assert one_shot.disarmed and one_shot.disarmed_job_id == "gh-d-close-1"
    assert close_issue(client, "d-close-2") == {"status": "ignored", "reason": "no-matching-close-trigger"}

    assert triggers.rearm(Trigger.objects.filter(pk=one_shot.pk)) == 1
    assert close_issue(client, "d-close-3")["status"] == "duplicate"  # inside the 10-minute window of the first
    redis_conn.delete("pidispatch:dedup:github:acme/web#7:closed:retro")  # ... and after it
    answer = close_issue(client, "d-close-4")
    one_shot.refresh_from_db()
    assert answer == {"status": "queued", "jobs": ["gh-d-close-4"]}
    assert job_spec(redis_conn, "gh-d-close-4")["once_armed_at"] == one_shot.armed_at.isoformat()


@pytest.mark.django_db
def test_a_job_from_before_the_rearming_does_not_spend_it(forges):
    one_shot = rule(position=0, kind="github", on_type="issue", actions=["closed"], number=7, once=True, flow="retro")
    old_arming = one_shot.armed_at.isoformat()
    Trigger.objects.filter(pk=one_shot.pk).update(disarmed_at=one_shot.armed_at, disarmed_job_id="gh-first")
    triggers.rearm(Trigger.objects.all())

    late = JobSpec(job_id="gh-first", kind="github", repo="acme/web", number=7, flow="retro", once=True,
                   once_armed_at=old_arming, trigger_id=one_shot.pk, trigger_type="issue")
    assert triggers.disarm_spent(late) is False

    one_shot.refresh_from_db()
    current = JobSpec(job_id="gh-second", kind="github", repo="acme/web", number=7, flow="retro", once=True,
                      once_armed_at=one_shot.armed_at.isoformat(), trigger_id=one_shot.pk, trigger_type="issue")
    assert triggers.disarm_spent(current) is True
    one_shot.refresh_from_db()
    assert one_shot.disarmed_job_id == "gh-second"


@pytest.mark.django_db
def test_ordinary_runs_disarm_nothing(forges):
    label = rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    spec = JobSpec(job_id="gh-x", kind="github", repo="acme/web", number=7, flow="fix-bug", trigger_id=label.pk)
    assert triggers.disarm_spent(spec) is False
