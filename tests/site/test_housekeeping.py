"""`manage.py housekeeping`: each retention line with rows on both sides of it, pending deliveries kept whatever
their age, batches rather than one DELETE, the dry run, one run at a time, a clear error without Redis, and the
cost page and /metrics right after a prune (the page as a fresh computation reads it, the counters unchanged)."""

import io
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.access import tokens
from apps.access.models import ApiToken
from apps.fleet.models import FleetAction
from apps.insight import costs
from apps.receiver.models import Delivery
from apps.worker import housekeeping
from apps.worker.models import AcceptedJob, Run, RunChanges, RunLog
from tests.conftest import ROOT, wait_for
from tests.cost_support import make_run

pytestmark = [pytest.mark.django_db(transaction=True)]

PAGE = "/admin/insight/spend/"


def housekeep(*args) -> str:
    out = io.StringIO()
    call_command("housekeeping", *args, stdout=out)
    return out.getvalue()


def utc_midnight():
    return timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def run_at(job_id: str, started, **fields) -> Run:
    return Run.objects.create(job_id=job_id, kind="github", started_at=started, ended_at=started + timedelta(minutes=3),
                              outcome=fields.pop("outcome", "completed"), **fields)


def delivery(delivery_id: str, status: str, days_ago: float) -> Delivery:
    row = Delivery.objects.create(forge="github", delivery_id=delivery_id, status=status)
    Delivery.objects.filter(pk=row.pk).update(received_at=timezone.now() - timedelta(days=days_ago))
    return row


def test_each_retention_line_deletes_what_is_past_it_and_keeps_the_rest():
    now = timezone.now()
    # Runs: kept for the UTC day 365 days back and every day since; the day before it goes, with its log.
    line = utc_midnight() - timedelta(days=365)
    old = run_at("gh-past-line", line - timedelta(minutes=1))
    RunLog.objects.create(run=old, output="old output", created_at=now)
    RunChanges.objects.create(run=old, source="pushed", diff="old diff", created_at=now)
    kept = run_at("gh-on-line", line + timedelta(minutes=1))
    RunLog.objects.create(run=kept, output="kept output", created_at=now)
    run_at("gh-today", now)
    # Deliveries: settled ones past 30 days go; younger ones, and pending or in-hand ones of any age, stay.
    for status in ("queued", "duplicate", "ignored", "rejected", "discarded"):
        delivery(f"old-{status}", status, 31)
    delivery("young-queued", "queued", 29)
    delivery("old-pending", "pending", 400)
    delivery("old-received", "received", 400)
    # The fleet's audit: a year.
    FleetAction.objects.create(action="pause", actor="alice", outcome="paused", at=now - timedelta(days=366))
    FleetAction.objects.create(action="resume", actor="alice", outcome="resumed", at=now - timedelta(days=364))
    # Accepted jobs: the rows of jobs settled more than a day ago; open ones stay whatever their age.
    AcceptedJob.objects.create(job_id="gh-settled-long-ago", queue="pi-jobs", accepted_at=now - timedelta(days=3),
                               settled_at=now - timedelta(days=2))
    AcceptedJob.objects.create(job_id="gh-settled-now", queue="pi-jobs", accepted_at=now, settled_at=now)
    AcceptedJob.objects.create(job_id="gh-open", queue="pi-jobs", accepted_at=now - timedelta(days=30))
    # Sessions: expired ones.
    Session.objects.create(session_key="a" * 32, session_data="", expire_date=now - timedelta(minutes=1))
    Session.objects.create(session_key="b" * 32, session_data="", expire_date=now + timedelta(days=1))
    # API tokens: revoked and expired ones go; an active one, one that never expires and an inactive user's stay.
    alice = User.objects.create_user("alice")
    revoked, _ = tokens.issue(alice, name="revoked", scope="read")
    tokens.revoke(ApiToken.objects.filter(pk=revoked.pk))
    expired, _ = tokens.issue(alice, name="expired", scope="read", expires_at=now + timedelta(days=1))
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=now - timedelta(seconds=1))
    tokens.issue(alice, name="active", scope="read", expires_at=now + timedelta(days=1))
    tokens.issue(alice, name="forever", scope="operate")
    bob = User.objects.create_user("bob", is_active=False)
    tokens.issue(bob, name="inactive user", scope="read")

    out = housekeep()

    assert sorted(Run.objects.values_list("job_id", flat=True)) == ["gh-on-line", "gh-today"]
    assert list(RunLog.objects.values_list("output", flat=True)) == ["kept output"]
    assert not RunChanges.objects.exists()  # went with its run
    assert sorted(Delivery.objects.values_list("delivery_id", flat=True)) == ["old-pending", "old-received",
                                                                             "young-queued"]
    assert list(FleetAction.objects.values_list("action", flat=True)) == ["resume"]
    assert list(Session.objects.values_list("session_key", flat=True)) == ["b" * 32]
    assert sorted(AcceptedJob.objects.values_list("job_id", flat=True)) == ["gh-open", "gh-settled-now"]
    assert sorted(ApiToken.objects.values_list("name", flat=True)) == ["active", "forever", "inactive user"]
    assert "last run: none recorded" in out
    assert f"runs: 1 to delete, run records started before {line:%Y-%m-%d} 00:00 UTC (PI_RUN_RETENTION_DAYS=365)" in out
    assert ("done in" in out and "runs 1, deliveries 5, fleet actions 1, accepted jobs 1, sessions 1, api tokens 2; "
            "recorded as the last run") in out

    again = housekeep()
    assert "last run: " in again and "(command by " in again and "runs 1, deliveries 5" in again
    assert "runs 0, deliveries 0, fleet actions 0, accepted jobs 0, sessions 0, api tokens 0" in again


def test_shorter_retention_settings_move_the_lines(settings):
    settings.PI_RUN_RETENTION_DAYS = 7
    settings.PI_DELIVERY_RETENTION_DAYS = 10
    make_run("gh-8-days", 8)
    make_run("gh-7-days", 7)
    delivery("eleven-days", "ignored", 11)
    delivery("nine-days", "ignored", 9)

    housekeep()

    assert list(Run.objects.values_list("job_id", flat=True)) == ["gh-7-days"]
    assert list(Delivery.objects.values_list("delivery_id", flat=True)) == ["nine-days"]


def test_the_dry_run_says_what_would_go_and_deletes_nothing():
    make_run("gh-old", 400)
    make_run("gh-new", 1)
    delivery("old", "queued", 40)
    delivery("old-pending", "pending", 40)

    out = housekeep("--dry-run")

    assert "dry run: nothing is deleted" in out
    assert [line.split()[:2] for line in out.splitlines() if line.startswith(("runs ", "deliveries "))] == [
        ["runs", "1"], ["deliveries", "1"]]
    assert "would delete 2 rows in batches of 1,000" in out
    assert Run.objects.count() == 2 and Delivery.objects.count() == 2


def test_runs_go_in_batches_each_its_own_delete_with_progress():
    for index in range(5):
        make_run(f"gh-old-{index}", 400 + index)

    with CaptureQueriesContext(connection) as queries:
        out = housekeep("--batch-size", "2")

    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('DELETE FROM "worker_run"')]
    assert len(deletes) == 3, deletes  # 2 + 2 + 1, never one DELETE of the whole past
    assert Run.objects.count() == 0
    assert "runs: 5 to delete" in out and "runs: 5 of 5 deleted" in out


def test_one_run_at_a_time(redis_conn, worker_env):
    for index in range(6):
        make_run(f"gh-slow-{index}", 400)
    slow = subprocess.Popen([sys.executable, "manage.py", "housekeeping", "--batch-size", "1", "--pause", "1"],
                            cwd=ROOT, env=worker_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: housekeeping.running(redis_conn), timeout=60, what="the first run's lock")
        with pytest.raises(CommandError) as refused:
            housekeep()
        assert "housekeeping is already running: " in str(refused.value)
        assert f"#{slow.pid} (command) since " in str(refused.value)
    finally:
        output, _ = slow.communicate(timeout=60)
    assert slow.returncode == 0, output
    assert "runs 6" in output and Run.objects.count() == 0
    assert housekeeping.running(redis_conn) is None  # the lock is given back


def test_without_redis_it_says_so_and_deletes_nothing(settings):
    make_run("gh-old", 400)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    with pytest.raises(CommandError) as refused:
        housekeep()
    assert "Redis does not answer at redis://127.0.0.1:1/0" in str(refused.value)
    assert "start Redis or fix REDIS_URL" in str(refused.value)
    assert Run.objects.count() == 1
    assert "runs" in housekeep("--dry-run")  # the dry run needs no Redis


# --- the cost page and /metrics across a prune ---------------------------------------------------------------

def tile(page: str, name: str) -> str:
    import re

    block = page.split(f'id="kpi-{name}"')[1]
    return re.search(r'class="kpi-value">([^<]*)<', block).group(1).strip()


def scrape(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}


def forget_kept_partials(redis_conn):
    keys = redis_conn.keys("pidispatch:insight:day:*")
    if keys:
        redis_conn.delete(*keys)


def comparable(summary) -> tuple:
    return (summary.totals, summary.days,
            [(b.name, [(r.label, r.runs, r.spend, r.tokens) for r in b.rows], b.more) for b in summary.breakdowns])


def test_at_the_default_retention_a_prune_changes_nothing_on_the_cost_page(admin_client, redis_conn):
    """A year's retention lies far outside the page's longest window: every window reads the same before and after."""
    make_run("gh-today", 0, cost="0.50", tokens=100)
    make_run("gh-1", 1, cost="1.00", tokens=200, flow="review")
    make_run("gh-6", 6, cost="2.00", tokens=300, host="hostB", outcome="failed", reason="runner-infra")
    make_run("gh-29", 29, cost="4.00", tokens=400, host="hostC")
    for days in (367, 400, 700):
        make_run(f"gh-{days}", days, cost="100.00", tokens=10_000, host="hostOld")
    now = timezone.now()
    windows = list(costs.WINDOWS)
    pages = {key: admin_client.get(f"{PAGE}?window={key}").content.decode() for key in windows}
    before = {key: comparable(costs.summary(key, now)) for key in windows}

    assert "runs 3," in housekeep()
    assert Run.objects.count() == 4

    for key in windows:
        page = admin_client.get(f"{PAGE}?window={key}").content.decode()
        for name in ("spend", "runs", "tokens"):
            assert tile(page, name) == tile(pages[key], name), (key, name)
        assert comparable(costs.summary(key, now)) == before[key], key
    assert tile(pages["30d"], "spend") == "$7.50"


def test_the_cost_page_after_a_prune_reads_as_a_fresh_computation(admin_client, redis_conn, settings):
    settings.PI_RUN_RETENTION_DAYS = 10
    make_run("gh-today", 0, cost="0.50", tokens=100)
    make_run("gh-3", 3, cost="1.00", tokens=200, flow="review")
    make_run("gh-9", 9, cost="2.00", tokens=300, host="hostB")
    make_run("gh-12", 12, cost="4.00", tokens=400, host="hostC", outcome="failed", reason="runner-infra")
    make_run("gh-20", 20, cost="8.00", tokens=800, host="hostC", flow="triage")

    page = admin_client.get(PAGE + "?window=30d").content.decode()
    assert tile(page, "spend") == "$15.50" and tile(page, "runs") == "5"
    assert redis_conn.exists(costs.partial_key(costs.window("30d").days[-13]))  # day 12's partial is kept

    out = housekeep()
    assert "runs 2," in out

    page = admin_client.get(PAGE + "?window=30d").content.decode()
    assert tile(page, "spend") == "$3.50" and tile(page, "runs") == "3" and tile(page, "tokens") == "600"
    assert "hostC" not in page and "triage" not in page
    now = timezone.now()
    after_prune = comparable(costs.summary("30d", now))
    forget_kept_partials(redis_conn)
    assert comparable(costs.summary("30d", now)) == after_prune  # exactly what a fresh computation reads


def test_metrics_counters_keep_the_pruned_runs_and_the_inbox_gauge_drops_its_pruned_rows(client, redis_conn,
                                                                                         settings):
    settings.PI_RUN_RETENTION_DAYS = 10
    make_run("gh-today", 0, cost="0.50", tokens=100)
    make_run("gh-12", 12, cost="4.00", tokens=400, outcome="failed", reason="runner-infra")
    make_run("gh-20", 20, cost="8.00", tokens=800, outcome="policy", reason="token-budget")
    make_run("gh-400", 400, cost="16.00", tokens=1600, outcome="failed", reason="runner-infra")
    delivery("old", "queued", 40)
    delivery("new", "queued", 1)

    before = scrape(client)  # the closed days' partials are kept
    assert before[("pidispatch_run_cost_dollars_total", ())] == pytest.approx(28.5)
    assert before[("pidispatch_deliveries", (("forge", "github"), ("status", "queued")))] == 2

    housekeep()
    assert Run.objects.count() == 1

    after = scrape(client)
    runs = {key: value for key, value in after.items() if key[0] == "pidispatch_runs_total"}
    assert runs == {key: value for key, value in before.items() if key[0] == "pidispatch_runs_total"}
    assert runs[("pidispatch_runs_total", (("outcome", "failed"), ("reason", "runner-infra")))] == 2
    for name in ("pidispatch_run_cost_dollars_total", "pidispatch_run_tokens_total"):
        assert after[(name, ())] == before[(name, ())], name
    assert after[("pidispatch_gateway_refusals_total", (("reason", "token-budget"),))] == 1
    assert after[("pidispatch_deliveries", (("forge", "github"), ("status", "queued")))] == 1

    forget_kept_partials(redis_conn)
    assert scrape(client) == after  # a fresh computation reads the same

    make_run("gh-12-late", 12, cost="1.00", tokens=10, outcome="failed", reason="runner-infra")  # settled late
    later = scrape(client)
    assert later[("pidispatch_runs_total", (("outcome", "failed"), ("reason", "runner-infra")))] == 3
    assert later[("pidispatch_run_cost_dollars_total", ())] == pytest.approx(29.5)


def test_the_last_run_is_recorded_for_the_doctor(redis_conn):
    make_run("gh-old", 400)
    housekeep()
    record = json.loads(redis_conn.get(housekeeping.LAST_KEY))
    assert record["how"] == "command" and record["deleted"]["runs"] == 1
    assert timezone.now() - datetime.fromisoformat(record["at"]) < timedelta(minutes=1)
