"""The admin fleet panel: who may see and steer it, what it shows (state over the union, hosts, queues,
waiting and failed jobs, spend against the caps), and that every change is a CSRF-checked POST calling
the same services as `manage.py fleet`."""

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from rq import Queue

from apps.fleet import pauses, registry, waiting
from apps.fleet.models import FleetAction
from apps.worker.models import Run
from tests.fleet_support import PANEL, csrf_post, publish, staff

pytestmark = [pytest.mark.django_db(transaction=True)]


def run(job_id, minutes_ago=0, **fields):
    started = timezone.now() - timedelta(minutes=minutes_ago)  # now: today's, also just after midnight
    values = dict(kind="github", target="acme/web#7", started_at=started, ended_at=started, outcome="completed",
                  budget_reserved=True)
    values.update(fields)
    return Run.objects.create(job_id=job_id, **values)


def test_the_panel_shows_state_hosts_queues_waiting_failed_and_spend(admin_client, redis_conn, settings):
    settings.PI_DAILY_CAP = 10
    publish(redis_conn, "hostA", capabilities=["wait:ci-green"],
            job=registry.RunningJob("gh-busy", time.time() - 300, "acme/web#7", "pi-jobs@hostA"))
    pauses.pause(redis_conn, ["pi-jobs@hostA"], by="admin:alice", note="disk swap")
    queue = Queue("pi-jobs", connection=redis_conn)
    held = queue.enqueue_call("tests.jobfuncs.defer_once", args=(1,), job_id="gh-held")
    queue.schedule_job(held, timezone.now() + timedelta(minutes=10))
    waiting.note(redis_conn, "gh-held", queue="pi-jobs", reason="wait-for",
                 until=timezone.now() + timedelta(minutes=10),
                 detail={"waitingOn": "profile ci-green", "checks": 3}, target="acme/web#9",
                 since=time.time() - 3600)
    failed = queue.enqueue_call("tests.jobfuncs.defer_once", args=(1,), job_id="gh-broke")
    queue.remove(failed)
    failed.set_status("failed")
    failed.failed_job_registry.add(failed, ttl=600)
    run("gh-broke", outcome="failed", reason="runner-infra")
    for index in range(3):
        run(f"gh-today-{index}", tokens_total=1000, cost=Decimal("0.5"))
    run("gh-no-slot", budget_reserved=False, tokens_total=5)
    run("gh-last-month", minutes_ago=60 * 24 * 40, cost=Decimal("9"))
    # The meters show the counters the caps are checked against: four reservations, 3005 tokens today.
    from apps.worker.gates import budget
    from apps.worker.gates.runtime_settings import current

    for _ in range(4):
        budget.reserve(redis_conn, None, current(), timezone.now())
    budget.record_tokens(redis_conn, 3005, timezone.now())

    page = admin_client.get(PANEL).content.decode()

    assert 'id="fleet-state">PART PAUSED' in page
    assert "hostA" in page and "liveness-live" in page and "wait:ci-green" in page
    assert "gh-busy</span></a> · 5m · acme/web#7" in page  # linked to its live page
    assert "admin:alice" in page and "disk swap" in page
    assert "gh-held" in page and "held" in page and "wait-for · waitingOn=profile ci-green checks=3" in page
    assert "acme/web#9" in page and "60m" in page
    assert "gh-broke" in page and "failed runner-infra" in page
    day = page.split('id="meter-day"')[1].split("</tr>")[0]
    assert "<td>4</td>" in day and "<td>10</td>" in day and "40%" in day
    assert "3,005" in page and "1.5" in page  # tokens and cost today


def test_the_panel_redirects_from_the_fleet_app_url(admin_client):
    assert admin_client.get("/admin/fleet/")["Location"] == PANEL


def test_the_body_fragment_refreshes_without_the_page(admin_client):
    response = admin_client.get(PANEL + "body/")

    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    body = response.content.decode()
    assert 'id="fleet-state">RUNNING' in body and "<html" not in body


def test_staff_without_the_view_permission_cannot_see_it(redis_conn):
    client = staff()

    assert client.get(PANEL).status_code == 403
    assert client.get(PANEL + "body/").status_code == 403


def test_viewers_see_no_buttons_and_cannot_post(redis_conn):
    client = staff("view_fleet")

    page = client.get(PANEL).content.decode()
    assert "Pause all" not in page and "Resume all" not in page and 'name="job_id"' not in page
    assert 'id="fleet-cancel-by-id"' not in page
    assert csrf_post(client, PANEL + "pause/", {"scope": "queue", "queue": "pi-jobs"}).status_code == 403
    assert csrf_post(client, PANEL + "cancel/", {"job_id": "x"}).status_code == 403
    assert pauses.read_flags(redis_conn) == {}


def test_changes_are_posts_with_csrf(redis_conn):
    client = staff("view_fleet", "pause_fleet")

    assert client.get(PANEL + "pause/").status_code == 405
    assert client.post(PANEL + "pause/", {"scope": "queue", "queue": "pi-jobs"}).status_code == 403  # no token
    assert pauses.read_flags(redis_conn) == {}


def test_pause_and_resume_a_queue_from_the_panel(redis_conn):
    client = staff("view_fleet", "pause_fleet")

    page = csrf_post(client, PANEL + "pause/",
                     {"scope": "queue", "queue": "pi-jobs", "confirm": "yes"}).content.decode()

    assert "Paused 1 queue(s): pi-jobs" in page and 'id="fleet-state">PAUSED' in page
    assert pauses.read_flags(redis_conn)["pi-jobs"].by == "operator"  # the person, as they log in
    assert FleetAction.objects.get().actor == "operator"
    page = csrf_post(client, PANEL + "resume/", {"scope": "queue", "queue": "pi-jobs"}).content.decode()
    assert "Resumed 1 queue(s): pi-jobs" in page and 'id="fleet-state">RUNNING' in page


def test_pause_all_needs_a_note_and_a_confirmation(redis_conn):
    publish(redis_conn, "hostA")
    client = staff("view_fleet", "pause_fleet")

    refused = csrf_post(client, PANEL + "pause/", {"scope": "all", "note": "", "confirm": "yes"}).content.decode()
    assert "Pausing every queue needs a note and a confirmation; nothing was changed" in refused
    assert pauses.read_flags(redis_conn) == {}

    done = csrf_post(client, PANEL + "pause/", {"scope": "all", "note": "incident 12", "confirm": "yes"})
    assert "Paused 2 queue(s): pi-jobs, pi-jobs@hostA" in done.content.decode()
    assert {f.note for f in pauses.read_flags(redis_conn).values()} == {"incident 12"}


def test_pause_and_resume_a_host_from_the_panel(redis_conn):
    publish(redis_conn, "hostA")
    client = staff("view_fleet", "pause_fleet")

    csrf_post(client, PANEL + "pause/", {"scope": "host", "host": "hostA", "confirm": "yes"})
    assert set(pauses.read_flags(redis_conn)) == {"pi-jobs@hostA"}
    csrf_post(client, PANEL + "resume/", {"scope": "host", "host": "hostA"})
    assert pauses.read_flags(redis_conn) == {}


def test_cancel_a_waiting_job_from_the_panel(redis_conn):
    queue = Queue("pi-jobs", connection=redis_conn)
    job = queue.enqueue_call("tests.jobfuncs.defer_once", args=(1,), job_id="gh-panel-cancel")
    queue.schedule_job(job, timezone.now() + timedelta(minutes=5))
    client = staff("view_fleet", "cancel_job")
    assert 'id="fleet-cancel-by-id"' in client.get(PANEL).content.decode()

    page = csrf_post(client, PANEL + "cancel/", {"job_id": "gh-panel-cancel"}).content.decode()

    assert "Removed deferred job gh-panel-cancel" in page  # the admin capitalises messages
    assert not redis_conn.exists("rq:job:gh-panel-cancel")
    assert FleetAction.objects.get(action="cancel").job_id == "gh-panel-cancel"


def test_a_bad_auto_resume_time_is_refused(redis_conn):
    client = staff("view_fleet", "pause_fleet")

    page = csrf_post(client, PANEL + "pause/", {"scope": "queue", "queue": "pi-jobs", "until": "soon",
                                                "confirm": "yes"}).content.decode()

    assert "is not an ISO 8601 time" in page and pauses.read_flags(redis_conn) == {}


def test_every_pause_confirms_and_takes_a_note_and_an_until(redis_conn):
    publish(redis_conn, "hostA")
    client = staff("view_fleet", "pause_fleet")
    page = client.get(PANEL).content.decode()
    assert 'class="button fleet-pause-open" data-scope="queue" data-target="pi-jobs"' in page
    assert 'data-scope="host" data-target="hostA"' in page

    refused = csrf_post(client, PANEL + "pause/", {"scope": "queue", "queue": "pi-jobs"}).content.decode()
    assert "A pause needs its confirmation" in refused and pauses.read_flags(redis_conn) == {}

    until = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    done = csrf_post(client, PANEL + "pause/", {"scope": "queue", "queue": "pi-jobs", "note": "deploying",
                                                "until": until.isoformat(), "confirm": "yes"}).content.decode()
    flag = pauses.read_flags(redis_conn)["pi-jobs"]
    assert (flag.note, flag.until, flag.by) == ("deploying", until, "operator")
    assert "deploying" in done and until.strftime("%H:%M:%S UTC") in done


def failed_job(redis_conn, spec):
    from rq.job import Job

    from tests.jobspecs import enqueue_spec

    enqueue_spec(spec)
    job = Job.fetch(spec.job_id, connection=redis_conn)
    Queue("pi-jobs", connection=redis_conn).remove(job)
    job.set_status("failed")
    job.failed_job_registry.add(job, ttl=600)
    run(spec.job_id, outcome="failed", reason="container-exit-unknown", attempt=2)
    return job


def test_failed_jobs_link_their_runs_and_can_be_retried_now_or_discarded(redis_conn, settings):
    from apps.worker.reasons import explain
    from tests.jobspecs import forge_spec

    settings.GITHUB_TOKEN = "ghp-x"
    failed_job(redis_conn, forge_spec("gh-broke-1"))
    failed_job(redis_conn, forge_spec("gh-broke-2", number=8))
    client = staff("view_fleet", "cancel_job")
    client_user = User.objects.get(username="operator")
    client_user.user_permissions.add(Permission.objects.get(codename="start_run"))

    page = client.get(PANEL).content.decode()
    assert '/admin/worker/run/?job_id=gh-broke-1' in page
    assert explain("container-exit-unknown").means.replace("'", "&#x27;") in page
    assert page.count("Retry now") == 2 and page.count(">Discard<") == 2

    retried = csrf_post(client, PANEL + "retry/", {"job_id": "gh-broke-1"}).content.decode()
    assert "Retried failed job gh-broke-1 as run-" in retried
    new_id = FleetAction.objects.get(action="retry").outcome.split(" as ")[1].split(" ")[0]
    new_job = Queue("pi-jobs", connection=redis_conn).fetch_job(new_id)
    assert new_job.get_status() == "queued" and new_job.args[0]["repo"] == "acme/web" and new_job.args[0]["number"] == 7
    assert not redis_conn.exists("rq:job:gh-broke-1")

    discarded = csrf_post(client, PANEL + "discard/", {"job_id": "gh-broke-2"}).content.decode()
    assert "Discarded failed job gh-broke-2" in discarded and not redis_conn.exists("rq:job:gh-broke-2")
    assert Run.objects.filter(job_id="gh-broke-2").exists()  # the evidence stays
    assert list(FleetAction.objects.values_list("action", "actor").order_by("id")) == [
        ("retry", "operator"), ("discard", "operator")]


def test_retrying_needs_the_start_run_permission(redis_conn):
    from tests.jobspecs import forge_spec

    failed_job(redis_conn, forge_spec("gh-broke-3"))
    client = staff("view_fleet", "cancel_job")
    assert "Retry now" not in client.get(PANEL).content.decode()
    client.get(PANEL)
    answer = client.post(PANEL + "retry/",
                         {"job_id": "gh-broke-3", "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    assert answer.status_code == 403 and redis_conn.exists("rq:job:gh-broke-3")


def test_recent_publications_link_the_pull_request_and_the_issue(admin_client):
    run("gh-pub-1", publish_outcome="published", pull_request=41, publish_url="https://github.com/acme/web/pull/41")
    page = admin_client.get(PANEL).content.decode()
    section = page.split('id="fleet-published"')[1]
    assert 'href="https://github.com/acme/web/pull/41">published #41' in section
    assert 'href="https://github.com/acme/web/issues/7"' in section


def test_the_cli_discards_and_retries_through_the_same_services(redis_conn, settings):
    from io import StringIO

    from django.core.management import call_command

    from tests.jobspecs import forge_spec

    settings.GITHUB_TOKEN = "ghp-x"
    failed_job(redis_conn, forge_spec("gh-cli-1"))
    failed_job(redis_conn, forge_spec("gh-cli-2"))
    out = StringIO()
    call_command("fleet", "discard", "gh-cli-1", "--by", "cli:ops", stdout=out)
    call_command("fleet", "retry", "gh-cli-2", "--by", "cli:ops", stdout=out)
    assert "discarded failed job gh-cli-1" in out.getvalue() and "retried failed job gh-cli-2 as run-" in out.getvalue()
    assert list(FleetAction.objects.values_list("action", "actor").order_by("id")) == [
        ("discard", "cli:ops"), ("retry", "cli:ops")]


def test_a_hand_started_local_job_is_not_retried_blind(redis_conn):
    from tests.jobspecs import local_spec

    failed_job(redis_conn, local_spec("run-local-9", "/srv/code/app"))
    client = staff("view_fleet", "cancel_job")
    User.objects.get(username="operator").user_permissions.add(Permission.objects.get(codename="start_run"))

    page = csrf_post(client, PANEL + "retry/", {"job_id": "run-local-9"}).content.decode()
    assert "its task is not kept after it ends" in page and redis_conn.exists("rq:job:run-local-9")
    assert not FleetAction.objects.exists()
