"""Run logs, kept on purpose: only with PI_CAPTURE_JOB_LOGS, scrubbed of every resolved secret value and the
provider key, bounded, read only with worker.view_run_log, and swept after PI_JOB_LOG_RETENTION_DAYS; the agent's
summary lives and goes with the log, the Run record keeps its length alone. Real workers, a real resolver."""

import json
import stat
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.forms.models import model_to_dict
from django.utils import timezone

from apps.worker import run_logs
from apps.worker.models import Outcome, Run, RunLog
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = pytest.mark.django_db(transaction=True)

VALUE = "s3cr3t-Value with spaces & $dollars"
KEY = "sk-ant-provider-key-0123456789"


def resolver(tmp_path, value=VALUE):
    path = tmp_path / "resolver.sh"
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' '{value}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def secret_job(job_id: str) -> str:
    return enqueue_spec(forge_spec(job_id, body="fake-agent:say-env=NPM_TOKEN", secrets={"NPM_TOKEN": "npm/ci"},
                                   secrets_profile="vault"))


def test_every_secret_is_scrubbed_as_it_is_and_inside_json_strings():
    quoted = 'pa"ss\\word'
    output = (f'plain {VALUE}\n{{"event":"tool","text":{json.dumps("x " + quoted)}}}\nkey {KEY}\n').encode()

    log = run_logs.captured(output, f"summary {VALUE}", [VALUE, quoted, KEY, ""])

    assert VALUE not in log.output and KEY not in log.output and "ss\\\\word" not in log.output
    assert log.output.count("[scrubbed]") == 3 and log.summary == "summary [scrubbed]"
    assert run_logs.captured(None, "anything", [VALUE]) is None  # capture off: nothing is kept


def test_a_long_output_keeps_its_start_and_end_and_the_cut_never_leaves_half_a_secret(settings):
    settings.PI_JOB_LOG_MAX_BYTES = 1024
    secret = "Z" * 300
    output = ("start\n" + "a" * 400 + secret + "b" * 2000 + "\nend").encode()  # the secret spans the cut

    log = run_logs.captured(output, "", [secret])

    assert log.truncated and log.output_bytes == len(output)
    assert log.output.startswith("start\n") and log.output.endswith("\nend") and "bytes left out]" in log.output
    assert "ZZZZ" not in log.output and len(log.output.encode()) < 1024 + 64


@pytest.mark.docker
def test_a_captured_run_keeps_its_scrubbed_log_for_those_allowed_to_read_it(run_worker, tmp_path, client):
    job_id = secret_job("gh-log-1")

    run_worker("pi-jobs", env_overrides={"PI_CAPTURE_JOB_LOGS": "1",
                                         "PI_SECRET_PROFILES": f"vault:{resolver(tmp_path)}"})

    run = Run.objects.get(job_id=job_id)
    assert run.outcome == Outcome.COMPLETED
    log = RunLog.objects.get(run=run)
    assert "the agent printed: [scrubbed]" in log.output and '{"event":"exit"' in log.output
    assert log.summary == "Done. It said [scrubbed]" and not log.truncated
    assert run.summary_chars == len(f"Done. It said {VALUE}")
    assert VALUE not in json.dumps(model_to_dict(run), default=str)  # the record holds no text of it

    url = run_logs.run_log_url(run)
    assert client.get(url).status_code == 302  # to the admin's login
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(url).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_run_log"))
    staff = User.objects.get(pk=staff.pk)  # permissions are cached per user object
    client.force_login(staff)
    page = client.get(url)
    assert page.status_code == 200 and page["Content-Type"].startswith("text/plain")
    assert page["Cache-Control"] == "no-store"
    text = page.content.decode()
    assert "Done. It said [scrubbed]" in text and "the agent printed: [scrubbed]" in text and VALUE not in text
    assert run_logs.run_log_text(run, staff) == text


@pytest.mark.docker
def test_a_secret_the_agent_says_is_scrubbed_from_the_pull_request_it_opens_too(run_worker, tmp_path,
                                                                              github_stand_in):
    job_id = secret_job("gh-posted-scrubbed")

    run_worker("pi-jobs", env_overrides={"PI_SECRET_PROFILES": f"vault:{resolver(tmp_path)}"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.publish_outcome) == (Outcome.COMPLETED, "published")
    (pull,) = [pr for pr in github_stand_in.created_pull_requests if pr["number"] == run.pull_request]
    # The title is the issue's; the agent's summary, scrubbed, is the body.
    assert pull["title"] == "A bug (#7)" and "Done. It said [scrubbed]" in pull["body"]
    assert VALUE not in json.dumps(pull)


@pytest.mark.docker
def test_a_summary_holding_the_provider_key_is_never_posted(run_worker, tmp_path, github_stand_in):
    """The agent got hold of the key (here a resolver hands it over) and says it: nothing of its work is published,
    the issue gets the fixed sentence, the run says why."""
    from tests.conftest import PROVIDER_KEY

    comments_before = len(github_stand_in.posted("/repos/acme/web/issues/7/comments"))
    job_id = secret_job("gh-posted-key")

    run_worker("pi-jobs", env_overrides={"PI_SECRET_PROFILES": f"vault:{resolver(tmp_path, PROVIDER_KEY)}"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.publish_outcome) == (Outcome.POLICY, "summary-held-secret",
                                                              "summary-held-secret")
    assert not [pr for pr in github_stand_in.created_pull_requests if job_id in pr["body"]]
    posted = github_stand_in.posted("/repos/acme/web/issues/7/comments")[comments_before:]
    assert [comment["body"] for comment in posted] == [
        "Stopped: nothing was published: the agent's summary held a credential of this deployment. The work is kept "
        "on the worker for the operator."]


@pytest.mark.docker
def test_without_capture_nothing_is_kept_but_the_summarys_length(run_worker, tmp_path, client):
    job_id = secret_job("gh-log-off")

    run_worker("pi-jobs", env_overrides={"PI_SECRET_PROFILES": f"vault:{resolver(tmp_path)}"})

    run = Run.objects.get(job_id=job_id)
    assert run.outcome == Outcome.COMPLETED and not RunLog.objects.exists()
    assert run.summary_chars == len(f"Done. It said {VALUE}")
    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    assert client.get(run_logs.run_log_url(run)).status_code == 404


@pytest.mark.docker
def test_the_workers_sweep_deletes_logs_past_their_retention(start_worker, fast_fleet):
    now = timezone.now()
    old = Run.objects.create(job_id="gh-old", kind="github", started_at=now, ended_at=now, outcome=Outcome.COMPLETED)
    new = Run.objects.create(job_id="gh-new", kind="github", started_at=now, ended_at=now, outcome=Outcome.COMPLETED)
    RunLog.objects.create(run=old, output="old output", summary="old summary", created_at=now - timedelta(days=3))
    RunLog.objects.create(run=new, output="new output", summary="new summary", created_at=now - timedelta(hours=47))

    start_worker("pi-jobs", env={"PI_JOB_LOG_RETENTION_DAYS": "2"})

    wait_for(lambda: not RunLog.objects.filter(run=old).exists(), timeout=30, what="the old log to be swept")
    assert list(RunLog.objects.values_list("summary", flat=True)) == ["new summary"]
    assert Run.objects.count() == 2  # the records stay


def test_the_run_page_links_the_log_only_for_those_who_may_read_it(client):
    now = timezone.now()
    run = Run.objects.create(job_id="gh-page", kind="github", started_at=now, ended_at=now,
                             outcome=Outcome.COMPLETED, summary_chars=12, dollar_basis="metered")
    RunLog.objects.create(run=run, output="output", summary="Fixed the footer link.", created_at=now)
    page = f"/admin/worker/run/{run.pk}/change/"
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(viewer)
    shown = client.get(page).content.decode()
    assert "metered" in shown and "View log" not in shown
    assert "Fixed the footer link." not in shown and "12" in shown  # the summary's length, not its words

    client.force_login(User.objects.create_superuser("root", password="pw"))
    shown = client.get(page).content.decode()
    assert f'<a href="{run_logs.run_log_url(run)}">View log</a>' in shown
    assert '<div class="agent-summary" style="white-space: pre-wrap">Fixed the footer link.</div>' in shown
