"""Starting a run from the admin goes through manual_runs (the service dispatch_run and the API use): its
refusals are shown beside their field, and nothing is queued until it accepts."""

import os
import re

import pytest
from rq.job import Job

from apps.receiver.models import Trigger
from apps.worker.manual_runs import ManualRunRefused, start_forge_run
from tests.local_repos import OWNER

pytestmark = pytest.mark.django_db

START = "/admin/start-run/"


def queued_jobs(redis_conn) -> list[str]:
    return sorted(key.decode().split(":")[-1] for key in redis_conn.keys("rq:job:*"))


def test_a_forge_run_is_queued_and_named(admin_client, settings, redis_conn):
    settings.GITHUB_TOKEN = "ghp-x"
    page = admin_client.get(START).content.decode()
    assert 'name="repository"' in page and 'name="folder"' in page and 'name="max_turns"' in page

    response = admin_client.post(START, {"where": "forge", "forge": "github", "repository": "acme/web", "number": 7,
                                         "target_type": "issue", "flow": "fix-bug", "task": "Look at the footer."},
                                 follow=True)
    text = response.content.decode()
    assert "acme/web#7" in text
    (job_id,) = queued_jobs(redis_conn)
    job = Job.fetch(job_id, connection=redis_conn)
    # The message's job id is the link to the job's runs.
    assert job.origin == "pi-jobs" and (
        f'Queued <a href="/admin/worker/run/?job_id={job_id}" id="started-job">{job_id}</a>' in text)


def test_the_services_refusal_is_shown_beside_its_field_and_nothing_is_queued(admin_client, settings, redis_conn):
    settings.GITHUB_TOKEN = "ghp-x"
    response = admin_client.post(START, {"where": "forge", "forge": "github", "repository": "acme/web", "number": 7,
                                         "target_type": "issue", "flow": "Not A Flow"})
    page = response.content.decode()
    with pytest.raises(ManualRunRefused) as refused:
        start_forge_run("github", "acme/web", 7, flow="Not A Flow")
    assert refused.value.message.replace("'", "&#x27;") in page
    assert 'class="form-row field-flow"><ul class="errorlist' in page
    assert queued_jobs(redis_conn) == []


def test_a_local_folder_run_refuses_a_dirty_tree_then_runs_it_forced(admin_client, repo, redis_conn):
    (repo / "wip.txt").write_text("not committed")
    os.lchown(repo / "wip.txt", *OWNER)
    form = {"where": "local", "folder": str(repo), "task": "Tidy the README."}
    page = admin_client.post(START, form).content.decode()
    assert "Commit or stash them, or run it forced" in page and queued_jobs(redis_conn) == []

    admin_client.post(START, {**form, "force": "on"})
    (job_id,) = queued_jobs(redis_conn)
    assert job_id.startswith("run-")


def test_run_now_on_a_schedule_opens_the_form_filled_in_from_it(admin_client, repo, redis_conn):
    rule = Trigger.objects.create(on_type="cron", cron_id="nightly", cron_pattern="0 6 * * *", kind="local",
                                  folder=str(repo), flow="tidy", task="Tidy the README.", max_turns=5)
    response = admin_client.post("/admin/receiver/trigger/", {"action": "run_now", "_selected_action": [rule.pk]})
    assert response.status_code == 302 and response.url.startswith(START)

    page = admin_client.get(response.url).content.decode()
    assert f'value="{repo}"' in page and 'value="tidy"' in page and "Tidy the README." in page
    assert re.search(r'value="local"[^>]*checked', page)
    assert queued_jobs(redis_conn) == []  # nothing starts before the operator confirms

    admin_client.post(START, {"where": "local", "folder": str(repo), "flow": "tidy", "task": "Tidy the README.",
                              "max_turns": 5})
    assert len(queued_jobs(redis_conn)) == 1

    change = admin_client.get(f"/admin/receiver/trigger/{rule.pk}/change/").content.decode()
    assert 'id="trigger-run-now"' in change


def test_run_now_needs_exactly_one_trigger(admin_client, label_trigger):
    other = Trigger.objects.create(on_type="label", label_any=["x"], kind="github", flow="fix-bug", position=2)
    response = admin_client.post("/admin/receiver/trigger/", {
        "action": "run_now", "_selected_action": [label_trigger.pk, other.pk]}, follow=True)
    assert "Select one trigger to run now" in response.content.decode()
