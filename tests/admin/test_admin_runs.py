"""The run list and run page answer "what did this run do, and why did it fail?"."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.receiver.models import Delivery
from apps.worker import reasons
from apps.worker.forges import comments
from apps.worker.models import Run

pytestmark = pytest.mark.django_db


def make_run(**fields) -> Run:
    started = fields.pop("started_at", timezone.now() - timedelta(minutes=5))
    defaults = dict(job_id="gh-deliv-1", kind="github", target="acme/web#7", scope="github:acme/web", flow="fix-bug",
                    host="hostA", queue="pi-jobs", started_at=started, ended_at=started + timedelta(seconds=30),
                    outcome="completed", exit_code=0)
    return Run.objects.create(**{**defaults, **fields})


@pytest.fixture
def retried_job(label_trigger):
    first = make_run(attempt=1, outcome="failed", reason="runner-infra", exit_code=3, trigger=label_trigger,
                     delivery_id="deliv-1", started_at=timezone.now() - timedelta(minutes=10))
    second = make_run(attempt=2, outcome="failed", reason="container-exit-unknown", exit_code=3,
                      trigger=label_trigger, delivery_id="deliv-1")
    return first, second


def test_every_reason_a_forge_sentence_exists_for_is_explained_for_the_operator():
    tokens = set(comments.REFUSED) | set(comments.STOPPED) | set(comments.FAILED)
    assert tokens - set(reasons.REASONS) == set()
    for reason in reasons.REASONS.values():
        assert reason.means.strip() and reason.next_step.strip(), reason.token
    assert {"token", "means", "next"} == set(reasons.as_table()[0])


def test_run_list_names_the_attempt_and_why_the_one_before_failed(admin_client, retried_job):
    page = admin_client.get("/admin/worker/run/").content.decode()

    assert "2 of 2, retried after runner-infra" in page
    assert "1 of 2" in page
    # The hover explains the reason from the table.
    assert reasons.explain("container-exit-unknown").means in page.replace("&#x27;", "'")


def test_attempt_link_lists_only_that_jobs_attempts(admin_client, retried_job):
    make_run(job_id="gh-other", attempt=1)
    page = admin_client.get("/admin/worker/run/?job_id=gh-deliv-1").content.decode()
    assert page.count('class="job-id"') == 2 and "gh-other" not in page


def test_failed_run_page_explains_the_reason_and_links_attempts_delivery_and_trigger(admin_client, retried_job):
    first, second = retried_job
    delivery = Delivery.objects.create(forge="github", delivery_id="deliv-1", event="issues", status="queued",
                                       job_ids=["gh-deliv-1"])

    page = admin_client.get(f"/admin/worker/run/{second.pk}/change/").content.decode().replace("&#x27;", "'")

    explained = reasons.explain("container-exit-unknown")
    assert explained.means in page and explained.next_step.split(";")[0] in page
    assert comments.FAILED_DEFAULT in page  # the final attempt's sentence on the issue
    assert 'href="https://github.com/acme/web/issues/7"' in page
    assert f'/admin/worker/run/{first.pk}/change/' in page and "attempt 1: failed runner-infra" in page
    assert f"/admin/receiver/delivery/{delivery.pk}/change/" in page
    assert f"/admin/receiver/trigger/{second.trigger_id}/change/" in page


def test_a_retried_attempt_posted_nothing_and_says_so(admin_client, retried_job):
    first, _ = retried_job
    page = admin_client.get(f"/admin/worker/run/{first.pk}/change/").content.decode()
    assert "posts no status sentence" in page


def test_published_run_page_links_the_pull_request_and_formats_money_and_usage(admin_client):
    run = make_run(publish_outcome="published", pull_request=41, pushed_commits=2,
                   publish_url="https://github.com/acme/web/pull/41", cost=Decimal("0.00420000000000000"),
                   usage={"models": [{"provider": "anthropic", "model": "claude-x", "calls": 3, "input": 1000,
                                      "output": 200, "total": 1200, "cost": "0.004200"}]})

    page = admin_client.get(f"/admin/worker/run/{run.pk}/change/").content.decode()
    assert 'href="https://github.com/acme/web/pull/41"' in page
    assert "$0.0042" in page and "0.00420000000000000" not in page
    assert '<table class="usage">' in page and "anthropic/claude-x" in page
    assert reasons.explain("published").means.replace("'", "&#x27;") in page

    listing = admin_client.get("/admin/worker/run/").content.decode()
    assert "published #41" in listing and "$0.0042" in listing
    assert " UTC" in listing  # times carry seconds and their zone


def test_long_job_ids_are_shortened_with_the_whole_id_on_hover(admin_client):
    long_id = "gh-" + "a" * 40 + "--0123456789abcdef"
    make_run(job_id=long_id)
    page = admin_client.get("/admin/worker/run/").content.decode()
    assert f'title="{long_id}"' in page and "…" in page


def test_a_triggers_run_count_links_its_runs(admin_client, retried_job, label_trigger):
    make_run(job_id="gh-unrelated")
    listing = admin_client.get("/admin/receiver/trigger/").content.decode()
    url = f"/admin/worker/run/?trigger__id__exact={label_trigger.pk}"
    assert f'href="{url}">2</a>' in listing
    runs = admin_client.get(url).content.decode()
    assert runs.count('class="job-id"') == 2 and "gh-unrelated" not in runs
