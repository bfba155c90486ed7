"""`/metrics`: Prometheus text computed at scrape time from the real database and Redis, after a known sequence of
deliveries, queue changes and runs of a real worker; the bearer token when one is set; never on the public edge."""

import importlib
import time

import pytest
from django.urls import clear_url_caches, set_urlconf
from prometheus_client.parser import text_string_to_metric_families

from apps.fleet import pauses, registry
from apps.worker.models import Outcome, Run
from tests.conftest import github_payload
from tests.jobspecs import enqueue_spec, forge_spec
from tests.receiver_support import deliver

pytestmark = [pytest.mark.django_db(transaction=True)]


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.mark.docker
def test_the_numbers_follow_deliveries_queues_and_runs(client, post_github, label_trigger, run_worker, redis_conn,
                                                     settings):
    before = scrape(client)
    assert value(before, "pidispatch_source_up", source="database") == 1
    assert value(before, "pidispatch_source_up", source="redis") == 1
    assert value(before, "pidispatch_runs_total", outcome="completed", reason="") is None

    # Three deliveries: one starts a job, the same issue again inside the dedup window, one no rule matches.
    job_id = deliver(post_github, "m-1", "fake-agent:tokens-in=1200 fake-agent:tokens-out=345 fake-agent:cost=0.0123")
    assert post_github(github_payload(body_text="again"), delivery="m-2").json()["status"] == "duplicate"
    assert post_github(github_payload(labels=("bug",)), delivery="m-3").json()["status"] == "ignored"
    enqueue_spec(forge_spec("gh-metrics-2", number=8))  # a second job, past the day's cap of one
    pauses.pause(redis_conn, ["pi-jobs"], by="test", note="metrics")
    registry.publish(redis_conn, registry.HostFacts(name="hostA", declared=True, version="0.1.0", image="img"),
                     registry.ProcessFacts(worker_name="w-hostA", pid=1, proc="x/y/1/1", started_at=time.time(),
                                           queues=("pi-jobs", "pi-jobs@hostA")))
    time.sleep(1.1)  # the oldest job has waited a measurable while

    waiting = scrape(client)
    for status, count in (("queued", 1), ("duplicate", 1), ("ignored", 1)):
        assert value(waiting, "pidispatch_deliveries", forge="github", status=status) == count, status
    assert value(waiting, "pidispatch_jobs", queue="pi-jobs", state="queued") == 2
    assert value(waiting, "pidispatch_queue_depth", queue="pi-jobs") == 2
    assert 1.0 <= value(waiting, "pidispatch_queue_oldest_job_age_seconds", queue="pi-jobs") < 120
    assert value(waiting, "pidispatch_queue_paused", queue="pi-jobs") == 1
    assert value(waiting, "pidispatch_queue_paused", queue="pi-jobs@hostA") == 0
    assert value(waiting, "pidispatch_hosts", liveness="live") == 1

    pauses.resume(redis_conn, ["pi-jobs"], by="test")
    settings.PI_DAILY_CAP = 1  # the scrape's view of the caps (this process), as the worker's below
    run_worker("pi-jobs", env_overrides={"PI_DAILY_CAP": "1", "PI_DAILY_TOKEN_CAP": "1000000"})
    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    assert Run.objects.get(job_id="gh-metrics-2").reason == "over-budget"

    after = scrape(client)
    assert value(after, "pidispatch_runs_total", outcome="completed", reason="") == 1
    assert value(after, "pidispatch_runs_total", outcome="policy", reason="over-budget") == 1
    assert value(after, "pidispatch_run_tokens_total") == 1545
    assert value(after, "pidispatch_run_cost_dollars_total") == pytest.approx(0.0123)
    assert value(after, "pidispatch_gateway_refusals_total", reason="token-budget") == 0
    assert value(after, "pidispatch_gateway_calls_today") == 0  # the demo runner reaches no provider
    assert value(after, "pidispatch_jobs", queue="pi-jobs", state="queued") == 0
    assert value(after, "pidispatch_queue_oldest_job_age_seconds", queue="pi-jobs") == 0
    assert value(after, "pidispatch_queue_paused", queue="pi-jobs") == 0
    # The budget: two reservations against a cap of one (the refused one counts), the run's tokens today.
    assert value(after, "pidispatch_budget_used", ledger="jobs", window="day", scope="") == 2
    assert value(after, "pidispatch_budget_cap", ledger="jobs", window="day", scope="") == 1
    assert value(after, "pidispatch_budget_state", ledger="jobs", window="day", scope="", state="over") == 1
    assert value(after, "pidispatch_budget_state", ledger="jobs", window="day", scope="", state="ok") == 0
    assert value(after, "pidispatch_budget_used", ledger="tokens", window="day", scope="") == 1545
    # This process: no cap.
    assert value(after, "pidispatch_budget_cap", ledger="tokens", window="day", scope="") is None
    assert value(after, "pidispatch_budget_state", ledger="tokens", window="day", scope="", state="off") == 1


def test_a_scrape_with_redis_down_says_so_and_still_counts_runs(client, settings):
    from django.utils import timezone

    Run.objects.create(job_id="gh-r1", kind="github", started_at=timezone.now(), ended_at=timezone.now(),
                       outcome="failed", reason="runner-infra")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    samples = scrape(client)
    assert value(samples, "pidispatch_source_up", source="redis") == 0
    assert value(samples, "pidispatch_source_up", source="budget") == 0
    assert value(samples, "pidispatch_source_up", source="database") == 1
    assert value(samples, "pidispatch_runs_total", outcome="failed", reason="runner-infra") == 1
    assert not any(name == "pidispatch_queue_depth" for name, _ in samples)  # unknown, not zero


def test_runs_of_closed_days_are_counted_from_kept_partials_and_late_records_count(client, redis_conn):
    from tests.cost_support import make_run

    make_run("gh-k1", 40, outcome="failed", reason="runner-infra", cost="1.00", tokens=100)
    make_run("gh-k2", 5, outcome="policy", reason="token-budget", cost="0.50", tokens=50)
    make_run("gh-k3", 0)
    first = scrape(client)
    assert redis_conn.keys("pidispatch:insight:day:*")  # the closed days were kept
    assert scrape(client) == first
    assert value(first, "pidispatch_runs_total", outcome="failed", reason="runner-infra") == 1
    assert value(first, "pidispatch_gateway_refusals_total", reason="token-budget") == 1
    assert value(first, "pidispatch_run_cost_dollars_total") == pytest.approx(1.5)

    make_run("gh-k4", 40, outcome="failed", reason="runner-infra", cost="2.00", tokens=10)  # settled late
    later = scrape(client)
    assert value(later, "pidispatch_runs_total", outcome="failed", reason="runner-infra") == 2
    assert value(later, "pidispatch_run_cost_dollars_total") == pytest.approx(3.5)
    assert value(later, "pidispatch_run_tokens_total") == 160


def test_spend_is_counted_by_project_and_pruned_runs_still_count(client, redis_conn, settings):
    from django.core.management import call_command

    from tests.cost_support import make_run

    make_run("gh-pm1", 40, cost="1.00", tokens=100, project="storefront")
    make_run("gh-pm2", 0, cost="0.50", tokens=100, project="storefront")
    make_run("gh-pm3", 0, cost="2.25", tokens=100, project="ops")
    make_run("gh-pm4", 0, cost="0.10", tokens=100)
    first = scrape(client)
    assert value(first, "pidispatch_project_cost_dollars_total", project="storefront") == pytest.approx(1.5)
    assert value(first, "pidispatch_project_cost_dollars_total", project="ops") == pytest.approx(2.25)
    assert value(first, "pidispatch_project_cost_dollars_total", project="") == pytest.approx(0.1)
    assert value(first, "pidispatch_runs_total", outcome="completed", reason="") == 4  # summed over projects

    settings.PI_RUN_RETENTION_DAYS = 30
    call_command("housekeeping")  # a counter never goes down: the pruned run still counts
    assert not Run.objects.filter(job_id="gh-pm1").exists()
    later = scrape(client)
    assert value(later, "pidispatch_project_cost_dollars_total", project="storefront") == pytest.approx(1.5)


def test_a_bearer_token_guards_the_scrape_when_set(client, settings):
    settings.PI_METRICS_TOKEN = "scrape-token-for-tests"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    samples = scrape(client, HTTP_AUTHORIZATION="Bearer scrape-token-for-tests")
    assert value(samples, "pidispatch_source_up", source="database") == 1


def test_without_a_token_only_this_host_scrapes_and_only_directly(client, settings):
    """Deny by default: with PI_METRICS_TOKEN unset, a scrape from another address, or one a proxy forwarded (nginx
    on the private server name), is refused with the setting to set; Prometheus on the host itself scrapes."""
    settings.PI_METRICS_TOKEN = ""
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    for refused in (client.get("/metrics", REMOTE_ADDR="10.0.0.5"),
                    client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="10.0.0.5"),
                    client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_REAL_IP="10.0.0.5")):
        assert refused.status_code == 403 and b"PI_METRICS_TOKEN" in refused.content


def test_the_public_edge_serves_no_metrics(settings, client):
    import pidispatch_site.urls as urls

    assert client.get("/metrics").status_code == 200
    settings.PI_PUBLIC_EDGE = True
    try:
        importlib.reload(urls)
        clear_url_caches()
        assert client.get("/metrics").status_code == 404
        assert client.get("/admin/insight/spend/").status_code == 404
    finally:
        settings.PI_PUBLIC_EDGE = False
        importlib.reload(urls)
        clear_url_caches()
        set_urlconf(None)
