"""Drain and undrain a host: its workers take nothing from any queue they serve while the other hosts go on, its
running job finishes, `fleet drain --wait` returns once it is idle (or names what still runs), and the panel,
`fleet status` and the API say which host is drained. Real worker processes on one Redis."""

import json
import time

import pytest
from rq import Queue

from apps.fleet import drains
from apps.fleet.models import FleetAction
from apps.worker.models import Outcome, Run
from tests.conftest import wait_for
from tests.fleet_support import PANEL, staff
from tests.jobspecs import enqueue_spec, forge_spec
from tests.process_support import host_row

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


@pytest.fixture
def two_hosts(start_worker, redis_conn, fast_fleet):
    for name in ("hostA", "hostB"):
        start_worker("pi-jobs", f"pi-jobs@{name}", env={"PI_WORKER_NAME": name}, name=name)
    for name in ("hostA", "hostB"):
        wait_for(lambda name=name: (row := host_row(redis_conn, name)) and row.liveness == "live", timeout=60,
                 what=f"{name}'s registry row")


def run_of(job_id):
    return Run.objects.filter(job_id=job_id).first()


def test_a_drained_host_finishes_its_job_and_takes_no_other_while_the_fleet_goes_on(two_hosts, fleet_command,
                                                                                     redis_conn):
    enqueue_spec(forge_spec("gh-drain-running", body="fake-agent:sleep=6"), "pi-jobs@hostA")
    wait_for(lambda: any(j.job_id == "gh-drain-running" for j in host_row(redis_conn, "hostA").running),
             timeout=60, what="hostA running its job")

    started = time.monotonic()
    drained = fleet_command("drain", "--host", "hostA", "--note", "upgrade", "--wait", "60", "--by", "ops")
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert "still running on hostA: gh-drain-running" in drained.stdout
    assert "host hostA is idle" in drained.stdout and time.monotonic() - started < 60
    assert run_of("gh-drain-running").outcome == Outcome.COMPLETED  # it was let finish
    assert [p.drain_seen for p in host_row(redis_conn, "hostA").processes] == [True]  # idle: its worker saw the drain
    assert [p.drain_seen for p in host_row(redis_conn, "hostB").processes] == [False]

    for index in range(3):
        enqueue_spec(forge_spec(f"gh-drain-shared-{index}", number=10 + index), "pi-jobs")
    enqueue_spec(forge_spec("gh-drain-own", number=20), "pi-jobs@hostA")
    for index in range(3):
        run = wait_for(lambda index=index: run_of(f"gh-drain-shared-{index}"), timeout=90,
                       what="the shared queue's jobs")
        assert run.host == "hostB"  # the rest of the fleet took them
    time.sleep(2)
    assert run_of("gh-drain-own") is None and Queue("pi-jobs@hostA", connection=redis_conn).job_ids == ["gh-drain-own"]

    status = json.loads(fleet_command("status", "--json").stdout)
    (hostA,) = [host for host in status["hosts"] if host["name"] == "hostA"]
    assert hostA["drained"]["by"] == "ops" and hostA["drained"]["note"] == "upgrade"
    assert all(queue["paused"] is False for queue in status["queues"])  # drained is not paused

    undrained = fleet_command("undrain", "--host", "hostA", "--by", "ops")
    assert undrained.returncode == 0 and "takes jobs again" in undrained.stdout
    assert wait_for(lambda: run_of("gh-drain-own"), timeout=60, what="its own job after the undrain").host == "hostA"
    assert [p.drain_seen for p in host_row(redis_conn, "hostA").processes] == [False]
    assert list(FleetAction.objects.order_by("at").values_list("action", "actor")) == [("drain", "ops"),
                                                                                      ("undrain", "ops")]


def test_drain_wait_names_what_still_runs_when_its_time_is_up(two_hosts, fleet_command, redis_conn):
    enqueue_spec(forge_spec("gh-drain-long", body="fake-agent:sleep=30"), "pi-jobs@hostB")
    wait_for(lambda: any(j.job_id == "gh-drain-long" for j in host_row(redis_conn, "hostB").running), timeout=60,
             what="hostB running its job")
    result = fleet_command("drain", "--host", "hostB", "--wait", "2")
    assert result.returncode == 1 and "host hostB still runs gh-drain-long after 2 s" in result.stderr
    assert drains.is_drained(redis_conn, "hostB")  # drained all the same: the job finishes, nothing new starts


def test_drain_wait_waits_until_each_worker_has_seen_the_drain(redis_conn, fast_fleet):
    """A worker that popped a job a moment before the drain has not yet said it runs it: the host is not idle until
    that worker has said it saw the drain (a restart then would kill the job it is about to start)."""
    from apps.fleet import registry

    host = registry.HostFacts(name="hostA", declared=True, version="v", image="i")

    def beat(worker_name, *, drain_seen=False, job=None):
        registry.publish(redis_conn, host, registry.ProcessFacts(
            worker_name=worker_name, pid=1, proc="p", started_at=time.time(), queues=("pi-jobs",), job=job,
            drain_seen=drain_seen))

    drains.drain(redis_conn, "hostA", by="ops")
    beat("w1", drain_seen=True)
    beat("w2")  # between its pop and its job's start: it says neither
    now = drains.wait_until_idle(redis_conn, "hostA", 1)
    assert not now.idle and now.running == [] and now.unsettled == ["w2"]

    beat("w2", job=registry.RunningJob("gh-picked", time.time()))  # the job it took starts
    assert drains.progress(redis_conn, "hostA").running == ["gh-picked"]
    beat("w2", drain_seen=True)  # it ended, and the worker saw the drain before taking another
    assert drains.wait_until_idle(redis_conn, "hostA", 5).idle

    # A worker of the release before (no drain_seen in its entry) is judged by its running job alone, as it was.
    beat("w3")
    redis_conn.hdel(registry.worker_key("w3"), "drain_seen")
    assert drains.progress(redis_conn, "hostA").idle


def test_the_panel_and_the_api_drain_and_undrain_a_host(client, redis_conn, fast_fleet):
    from tests.fleet_support import csrf_post, publish

    publish(redis_conn, "hostA")
    operator = staff("view_fleet", "pause_fleet")
    answer = csrf_post(operator, "/admin/fleet/fleetpanel/drain/", {"host": "hostA"})
    assert "host hosta drained" in answer.content.decode().lower()
    page = operator.get(PANEL).content.decode()
    assert "drained by operator" in page and "Undrain" in page

    from django.contrib.auth.models import User

    from apps.access.tokens import issue

    token = issue(User.objects.get(username="operator"), name="t", scope="operate")[1]
    answer = client.post("/api/v1/fleet/hosts/hostA/undrain", HTTP_AUTHORIZATION=f"Bearer {token}",
                         content_type="application/json")
    assert answer.status_code == 200 and answer.json()["changed"] is True
    assert not drains.is_drained(redis_conn, "hostA")
    bad = client.post("/api/v1/fleet/hosts/not a host/drain", HTTP_AUTHORIZATION=f"Bearer {token}",
                      content_type="application/json")
    assert bad.status_code in (400, 404)
