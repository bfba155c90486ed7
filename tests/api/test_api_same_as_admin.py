"""The API reaches the same result as the admin panel and the CLI, because it calls the same services: pause-all
over a union holding a dead host's paused queue, the cancel of a job running on another host, a manual run."""

import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rq import Queue
from rq.job import Job

from apps.access import tokens
from apps.fleet import pauses
from apps.worker.models import Outcome, Run
from tests.conftest import ROOT, wait_for
from tests.fleet_support import PANEL, csrf_post, publish
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def superuser():
    return User.objects.create_superuser("ops", password="pw")


@pytest.fixture
def api(superuser):
    _, token = tokens.issue(superuser, name="same-as-admin", scope="admin")
    client = Client()

    def post(path, body=None):
        return client.post(f"/api/v1/{path}", data=body or {}, content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")

    return post


@pytest.fixture
def admin(superuser):
    client = Client(enforce_csrf_checks=True)
    client.force_login(superuser)
    return client


def a_fleet_with_a_dead_hosts_paused_queue(redis_conn):
    from apps.fleet.models import QueuePause

    redis_conn.flushdb()
    QueuePause.objects.all().delete()  # nor is anything paused in the record (a pause outlives Redis's data)
    publish(redis_conn, "hostA")
    # hostB is long gone, its queue still paused: pause-all must count it, resume-all must clear it.
    redis_conn.sadd(pauses.INDEX, "pi-jobs@hostB")
    redis_conn.hset(pauses.flag_key("pi-jobs@hostB"), mapping={"by": "cli:old", "at": timezone.now().isoformat()})


def paused(redis_conn):
    return {queue: flag.note for queue, flag in pauses.read_flags(redis_conn).items()}


def test_pause_all_with_a_dead_hosts_paused_queue_is_the_same_from_the_api_and_the_admin(redis_conn, api, admin):
    a_fleet_with_a_dead_hosts_paused_queue(redis_conn)
    answer = api("fleet/pause-all", {"note": "provider outage"}).json()
    through_api = paused(redis_conn)

    a_fleet_with_a_dead_hosts_paused_queue(redis_conn)
    page = csrf_post(admin, PANEL + "pause/", {"scope": "all", "note": "provider outage", "confirm": "yes"})
    through_admin = paused(redis_conn)

    # The dead host's queue is in the union (its flag keeps it there); paused already, it keeps its own pause.
    assert through_api == through_admin == {"pi-jobs": "provider outage", "pi-jobs@hostA": "provider outage",
                                            "pi-jobs@hostB": ""}
    assert sorted(answer["changed"]) == ["pi-jobs", "pi-jobs@hostA"] and answer["ok"]
    assert answer["unchanged"] == ["pi-jobs@hostB"]
    assert answer["summary"][0].upper() + answer["summary"][1:] in page.content.decode()

    resumed = api("fleet/resume-all").json()
    assert resumed["ok"] and sorted(resumed["changed"]) == ["pi-jobs", "pi-jobs@hostA", "pi-jobs@hostB"]
    assert paused(redis_conn) == {}


@pytest.mark.docker
def test_cancel_of_a_job_running_on_another_host_is_the_same_from_the_api_and_the_admin(
        start_worker, redis_conn, fast_fleet, job_containers, api, admin):
    start_worker("pi-jobs", "pi-jobs@hostA", env={"PI_WORKER_NAME": "hostA"}, name="hostA")
    start_worker("pi-jobs", "pi-jobs@hostB", env={"PI_WORKER_NAME": "hostB"}, name="hostB")
    start_worker("pi-jobs", "pi-jobs@hostB", env={"PI_WORKER_NAME": "hostB"}, name="hostB-2")
    for job_id in ("gh-api-cancel", "gh-admin-cancel"):
        enqueue_spec(forge_spec(job_id, body="fake-agent:sleep=60"), "pi-jobs@hostB")

    def both_running():
        containers = job_containers("hostB")
        for container in containers.values():
            container.reload()
        return len([c for c in containers.values() if c.status == "running"]) == 2

    wait_for(both_running, timeout=120, what="both jobs' containers on hostB")

    answer = api("jobs/gh-api-cancel/cancel")
    page = csrf_post(admin, PANEL + "cancel/", {"job_id": "gh-admin-cancel"}).content.decode()

    assert answer.status_code == 200 and answer.json()["outcome"] == "stopping"
    said = answer.json()["message"].replace("gh-api-cancel", "gh-admin-cancel")
    assert "acknowledged by the worker on host hostB" in said and said[0].upper() + said[1:] in page
    for job_id in ("gh-api-cancel", "gh-admin-cancel"):
        run = wait_for(lambda job_id=job_id: Run.objects.filter(job_id=job_id).first(), timeout=60,
                       what=f"{job_id}'s record")
        assert (run.outcome, run.reason, run.host) == (Outcome.POLICY, "operator-cancel", "hostB")
    wait_for(lambda: not job_containers("hostB"), timeout=30, what="both containers to be stopped")


def queued_spec(redis_conn, queue, job_id):
    assert job_id in Queue(queue, connection=redis_conn).get_job_ids()
    spec = dict(Job.fetch(job_id, connection=redis_conn).args[0])
    spec.pop("job_id")
    spec.pop("created_at", None)
    return spec


def test_a_manual_run_is_the_same_job_from_the_api_the_admin_and_dispatch_run(redis_conn, api, admin, repo,  # noqa: F811
                                                                               worker_env, settings):
    env = {**worker_env, "PI_WORKER_NAME": "hostA"}
    cli = subprocess.run([sys.executable, "manage.py", "dispatch_run", str(repo), "--task", "Tidy the README",
                          "--flow", "fix-bug"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    cli_job = cli.stdout.split()[1]

    answer = api("runs", {"folder": str(repo), "host": "hostA", "task": "Tidy the README", "flow": "fix-bug"})

    assert answer.status_code == 202, answer.content
    assert answer.json()["queue"] == "pi-jobs@hostA"
    assert queued_spec(redis_conn, "pi-jobs@hostA", answer.json()["job_id"]) == \
        queued_spec(redis_conn, "pi-jobs@hostA", cli_job)

    refused = api("runs", {"folder": "relative/path", "host": "hostA", "task": "x"})
    assert refused.status_code == 400 and "absolute path" in refused.json()["fields"]["folder"][0]

    settings.PI_WORKER_NAME = "hostA"  # the admin's web process on the host that holds the folder
    admin.get("/admin/start-run/")
    page = admin.post("/admin/start-run/", {"where": "local", "folder": str(repo), "task": "Tidy the README",
                                             "flow": "fix-bug",
                                             "csrfmiddlewaretoken": admin.cookies["csrftoken"].value},
                      follow=True).content.decode()
    admin_job = next(job for job in Queue("pi-jobs@hostA", connection=redis_conn).get_job_ids()
                     if job not in (cli_job, answer.json()["job_id"]))
    assert admin_job in page
    assert queued_spec(redis_conn, "pi-jobs@hostA", admin_job) == queued_spec(redis_conn, "pi-jobs@hostA", cli_job)
