"""A forge is one entry in the registry (apps/forge_registry.py): a sixth one, written whole in tests/sixth_forge.py and
registered by its settings module, is served, matched, started, linked and checked with nothing else changed. The
processes here run with `DJANGO_SETTINGS_MODULE=tests.sixth_forge` on a database of their own and the tests' Redis."""

import json
import os
import subprocess
import sys

import pytest
from rq import Queue

from tests.conftest import ROOT

PROBE = r'''
import hashlib, hmac, json
from pathlib import Path

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from apps.access import tokens
from apps.receiver.models import Trigger
from apps.worker.models import Run

seen = {}
Trigger.objects.create(position=0, kind="sixth", on_type="label", label_any=["pi"], flow="fix-bug")
payload = json.loads(Path("tests/payloads/github/issues_labeled.json").read_text())
payload["issue"]["labels"] = [{"id": 1, "name": "pi", "color": "ededed"}]
body = json.dumps(payload).encode()
signature = "sha256=" + hmac.new(b"sixth-webhook-secret", body, hashlib.sha256).hexdigest()
client = Client(HTTP_HOST="localhost")
hook = client.post("/hooks/sixth", data=body, content_type="application/json", HTTP_X_GITHUB_EVENT="issues",
                   HTTP_X_GITHUB_DELIVERY="d-six", HTTP_X_HUB_SIGNATURE_256=signature)
seen["hook"] = [hook.status_code, hook.json()]

operator = User.objects.create_superuser("operator", "", "unused-password")
client.force_login(operator)
seen["start_page"] = client.get("/admin/start-run/").content.decode()
now = timezone.now()
run = Run.objects.create(job_id="sx-d-0", kind="sixth", target="team/app#5", started_at=now, ended_at=now,
                         outcome="completed", publish_outcome="published", pull_request=9,
                         publish_url="https://github.com/acme/web/pull/41")
seen["run_page"] = client.get(f"/admin/worker/run/{run.pk}/change/").content.decode()
seen["run_list"] = client.get("/admin/worker/run/?kind=sixth").content.decode()

_, token = tokens.issue(operator, name="probe", scope="operate")
bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
listed = client.get("/api/v1/runs?kind=sixth", **bearer)
seen["api_runs"] = [listed.status_code, [r["job_id"] for r in listed.json()["results"]]]
started = client.post("/api/v1/runs", data={"forge": "sixth", "repository": "team/app", "number": 5,
                                            "flow": "fix-bug"}, content_type="application/json", **bearer)
seen["api_start"] = [started.status_code, started.json()]
print("PROBE " + json.dumps(seen))
'''


def manage(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)


@pytest.fixture
def sixth_env(tmp_path, redis_conn):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.sixth_forge",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'sixth.sqlite3'}"}
    migrated = manage(env, "migrate", "-v0")
    assert migrated.returncode == 0, migrated.stderr
    return env


def test_a_sixth_forge_in_one_module_is_seen_by_doctor_the_matcher_the_admin_and_the_api(sixth_env, redis_conn):
    doctor = json.loads(manage(sixth_env, "doctor", "--json").stdout)
    (finding,) = [check for host in doctor["hosts"] for check in host["checks"] if check["check"] == "forge-sixth"]
    assert finding["status"] == "ok" and "SIXTH_WEBHOOK_SECRET set" in finding["finding"]
    assert "API https://api.sixth.example" in finding["finding"] and "SIXTH_TOKEN set" in finding["finding"]

    probe = manage(sixth_env, "shell", "-c", PROBE)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout.split("PROBE ", 1)[1])

    # The matcher: its hook verified the delivery, its trigger matched, its client allowed the actor, a job queued.
    status, answer = seen["hook"]
    assert status == 202 and [job.split("-")[0] for job in answer["jobs"]] == ["sx"]
    queue = Queue("pi-jobs", connection=redis_conn)
    queued = {job_id: queue.fetch_job(job_id).args[0] for job_id in queue.job_ids}  # the job payloads
    assert queued[answer["jobs"][0]]["kind"] == "sixth"

    # The admin: offered on Start a run by its label; its run's target and pull request link its own web pages.
    assert '<option value="sixth">Sixth Forge</option>' in seen["start_page"]
    assert 'href="https://sixth.example/web/team/app/tickets/5"' in seen["run_page"]
    assert 'href="https://sixth.example/web/team/app/changes/9"' in seen["run_page"]
    assert "github.com" not in seen["run_page"]
    assert 'href="https://sixth.example/web/team/app/changes/9"' in seen["run_list"]

    # The API: its runs are listed by kind, and a run on it is started.
    assert seen["api_runs"] == [200, ["sx-d-0"]]
    status, started = seen["api_start"]
    assert status == 202 and started["target"] == "team/app#5"
    assert queue.fetch_job(started["job_id"]).args[0]["kind"] == "sixth"
