"""The rest of the manual run: `dispatch_run --provider --model --max-turns` and `--trigger <cron id>` (run that
cron trigger now), through the service the API's `POST /api/v1/runs` and the admin's "Start a run" call
(apps/worker/manual_runs.py). Every bad value names its option and queues nothing."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rq import Queue
from rq.job import Job

from apps.access import tokens
from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def dispatch_run(env, *args):
    return subprocess.run([sys.executable, "manage.py", "dispatch_run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def queued_job_ids(redis_conn) -> list[str]:
    return sorted(key.decode().split(":")[-1] for key in redis_conn.keys("rq:job:*"))


def spec_of(redis_conn, job_id: str) -> dict:
    return dict(Job.fetch(job_id, connection=redis_conn).args[0])


def job_id_of(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[1]


def well_inside_a_minute():
    """Two starts of the same cron trigger are one job per minute: begin far enough from the next minute."""
    while timezone.now().second >= 40:  # each dispatch_run is a Django start: seconds on a busy machine
        time.sleep(1)


@pytest.fixture
def hosta_env(worker_env):
    return {**worker_env, "PI_WORKER_NAME": "hostA"}


@pytest.fixture
def nightly(repo):
    return Trigger.objects.create(
        on_type="cron", cron_id="nightly-tidy", cron_pattern="0 3 * * *", kind="local", folder=str(repo),
        flow="tidy", task="fake-agent:env-to-file=PI_ALLOWED_MODELS Tidy the README.", max_turns=4,
        allowed_models=["anthropic/claude-haiku-4-5"], max_cost_usd="0.5")


# --- --provider, --model, --max-turns ---------------------------------------------------------------------------

def test_provider_model_and_max_turns_reach_the_job_and_the_container(repo, hosta_env, redis_conn, run_worker,
                                                                       settings):
    job_id = job_id_of(dispatch_run(hosta_env, str(repo), "--task", "fake-agent:env-to-file=PI_MAX_TURNS x",
                                    "--provider", "anthropic", "--model", "claude-haiku-4-5", "--max-turns", "3"))
    spec = spec_of(redis_conn, job_id)
    assert (spec["provider"], spec["model"], spec["max_turns"]) == ("anthropic", "claude-haiku-4-5", 3)

    run_worker("pi-jobs@hostA", env_overrides={"PI_WORKER_NAME": "hostA"})

    run = Run.objects.get(job_id=job_id)
    assert run.outcome == Outcome.COMPLETED, run.reason
    assert (repo / "env-PI_MAX_TURNS.txt").read_text() == "3"  # the deployment's 30, lowered by the run


@pytest.mark.parametrize("extra, message", [
    (["--max-turns", "0"], "--max-turns a whole number of turns, at least 1"),
    (["--max-turns", "many"], "--max-turns 'many': a whole number of turns, at least 1"),
    (["--provider=-x"], "--provider '-x' is not a provider name"),
    (["--model", "claude sonnet"], "--model 'claude sonnet' is not a model name"),
])
def test_a_bad_value_names_its_option_and_queues_nothing(repo, hosta_env, redis_conn, extra, message):
    result = dispatch_run(hosta_env, str(repo), "--task", "x", *extra)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert queued_job_ids(redis_conn) == []


# --- --trigger ----------------------------------------------------------------------------------------------------

def test_a_cron_trigger_runs_now_with_its_own_fields_once_a_minute(nightly, repo, hosta_env, redis_conn, run_worker):
    well_inside_a_minute()
    first = dispatch_run(hosta_env, "--trigger", "nightly-tidy")
    again = dispatch_run(hosta_env, "--trigger", "nightly-tidy")

    job_id = job_id_of(first)
    assert (job_id.startswith(f"manual-{nightly.pk}-")
            and "for cron trigger nightly-tidy on pi-jobs@hostA" in first.stdout)
    assert job_id_of(again) == job_id and "already started this minute" in again.stdout
    assert Queue("pi-jobs@hostA", connection=redis_conn).get_job_ids() == [job_id]
    spec = spec_of(redis_conn, job_id)
    assert (spec["folder"], spec["flow"], spec["max_turns"], spec["max_cost_usd"], spec["models"]) == (
        str(repo), "tidy", 4, "0.500000", ("anthropic/claude-haiku-4-5",))
    assert (spec["trigger_id"], spec["trigger_type"]) == (nightly.pk, "cron")

    run_worker("pi-jobs@hostA", env_overrides={"PI_WORKER_NAME": "hostA"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.trigger_id) == (Outcome.COMPLETED, nightly.pk)
    assert (repo / "env-PI_ALLOWED_MODELS.txt").read_text() == "anthropic/claude-haiku-4-5"  # the trigger's list


@pytest.mark.parametrize("args, message", [
    (["--trigger", "nope"], "--trigger no cron trigger has the id 'nope'"),
    (["--trigger", "a:b"], "--trigger 'a:b' is not a cron trigger id"),
    (["--trigger", "nightly-tidy", "--task", "x"], "--trigger runs the cron trigger with its own fields: drop --task"),
    (["--trigger", "nightly-tidy", "--model", "m", "--max-turns", "2"], "drop --model, --max-turns"),
    (["--trigger", "nightly-tidy", "/srv/elsewhere"], "drop a folder"),
    (["--flow", "x"], "name a folder (with --task), or a cron trigger with --trigger"),
])
def test_a_bad_trigger_run_names_its_option_and_queues_nothing(nightly, hosta_env, redis_conn, args, message):
    result = dispatch_run(hosta_env, *args)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert queued_job_ids(redis_conn) == []


def test_a_cron_trigger_whose_folder_is_not_here_is_refused_with_what_to_do(nightly, hosta_env, redis_conn):
    nightly.folder = "/srv/not-on-this-host"
    nightly.save()
    result = dispatch_run(hosta_env, "--trigger", "nightly-tidy")
    assert result.returncode != 0
    assert "cron trigger 'nightly-tidy' cannot run on this host" in result.stderr
    assert "Run it on the host that holds its folder" in result.stderr and queued_job_ids(redis_conn) == []


# --- the API and the admin: the same service ------------------------------------------------------------------------

@pytest.fixture
def superuser():
    return User.objects.create_superuser("ops", password="pw")


@pytest.fixture
def api(superuser):
    _, token = tokens.issue(superuser, name="dispatch-run", scope="admin")
    client = Client()
    return lambda body: client.post("/api/v1/runs", data=body, content_type="application/json",
                                    HTTP_AUTHORIZATION=f"Bearer {token}")


def test_the_api_and_the_admin_run_a_cron_trigger_as_dispatch_run_does(nightly, hosta_env, redis_conn, api,
                                                                        superuser, settings):
    well_inside_a_minute()
    settings.PI_WORKER_NAME = "hostA"  # the web process on the host that holds the folder
    answer = api({"cron_trigger": "nightly-tidy"})
    assert answer.status_code == 202, answer.content
    job_id = answer.json()["job_id"]
    assert job_id.startswith(f"manual-{nightly.pk}-") and answer.json()["queue"] == "pi-jobs@hostA"
    cli = dispatch_run(hosta_env, "--trigger", "nightly-tidy")
    assert job_id_of(cli) == job_id  # one job: the same service, the same minute

    admin = Client()
    admin.force_login(superuser)
    page = admin.post("/admin/start-run/", {"where": "cron", "cron_trigger": "nightly-tidy"}, follow=True)
    assert "Queued " in page.content.decode() and f">{job_id}</a>" in page.content.decode()
    assert queued_job_ids(redis_conn) == [job_id]

    refused = admin.post("/admin/start-run/", {"where": "cron", "cron_trigger": "nope"}).content.decode()
    assert 'class="form-row field-cron_trigger"><ul class="errorlist' in refused
    assert "no cron trigger has the id &#x27;nope&#x27;" in refused


@pytest.mark.parametrize("body, field, message", [
    ({"cron_trigger": "nightly-tidy", "task": "x"}, "task", "a cron trigger runs with its own fields"),
    ({"cron_trigger": "nightly-tidy", "max_turns": 2}, "max_turns", "a cron trigger runs with its own fields"),
    ({"cron_trigger": "nope"}, "cron_trigger", "no cron trigger has the id 'nope'"),
    ({"cron_trigger": "nightly-tidy", "folder": "/srv/x"}, "non_field_errors", "or a cron_trigger"),
])
def test_the_api_names_the_field_of_a_bad_cron_trigger_run(nightly, api, redis_conn, settings, body, field, message):
    settings.PI_WORKER_NAME = "hostA"
    answer = api(body)
    assert answer.status_code == 400, answer.content
    fields = answer.json().get("fields", {})
    assert any(message in text for text in fields.get(field, [])), answer.json()
    assert queued_job_ids(redis_conn) == []


def test_the_api_never_says_where_a_cron_triggers_folder_is(nightly, api, redis_conn, settings):
    settings.PI_WORKER_NAME = "hostA"
    nightly.folder = "/srv/secret-place"
    nightly.save()
    answer = api({"cron_trigger": "nightly-tidy"})
    assert answer.status_code == 400 and "secret-place" not in answer.content.decode()
    assert list(answer.json()["fields"]) == ["cron_trigger"] and not Path("/srv/secret-place").exists()
