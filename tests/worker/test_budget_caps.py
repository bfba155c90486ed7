"""Job-count caps: atomic Redis counters on UTC windows, scoped limits first, soft hold, refused
reservations still count, and slots come back only when no container started."""

import threading
from datetime import UTC, datetime

import docker
import pytest

from apps.worker.gates import budget
from apps.worker.gates.runtime_settings import current
from apps.worker.models import DispatchSettings, Outcome, Run, ScopedLimit
from tests.conftest import joined
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = pytest.mark.django_db(transaction=True)
NOW = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)  # a Wednesday


def test_window_keys_are_utc_calendar_windows_with_monday_weeks():
    keys = budget.window_keys("all", NOW)
    assert keys == {"day": "pidispatch:budget:all:d:2026-03-04", "week": "pidispatch:budget:all:w:2026-03-02",
                    "month": "pidispatch:budget:all:m:2026-03"}


def test_twenty_threads_racing_a_cap_of_five_get_exactly_five(redis_conn, settings):
    settings.PI_DAILY_CAP = 5
    caps, results = current(), []

    def race():
        try:
            budget.reserve(redis_conn, None, caps, NOW)
            results.append("ok")
        except budget.CapRefusal as refusal:
            results.append(refusal.reason)

    threads = [threading.Thread(target=race) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        joined(thread, 60, "a reservation racing the others")

    assert results.count("ok") == 5 and results.count("over-budget") == 15
    assert int(redis_conn.get(budget.window_keys("all", NOW)["day"])) == 20  # refusals still count
    ttl = redis_conn.ttl(budget.window_keys("all", NOW)["day"])
    assert 86400 < ttl <= 2 * 86400


def test_soft_hold_stops_new_starts_inside_the_band(redis_conn, settings):
    settings.PI_DAILY_CAP, settings.PI_SOFT_HOLD_PCT = 10, 50
    caps = current()
    for _ in range(5):
        budget.reserve(redis_conn, None, caps, NOW)
    with pytest.raises(budget.CapRefusal) as refusal:
        budget.reserve(redis_conn, None, caps, NOW)
    assert (refusal.value.reason, refusal.value.budget_reserved) == ("soft-hold", True)


def test_weekly_and_monthly_caps_apply_when_set(redis_conn, settings):
    settings.PI_DAILY_CAP, settings.PI_WEEKLY_CAP = 100, 2
    caps = current()
    budget.reserve(redis_conn, None, caps, NOW)
    budget.reserve(redis_conn, None, caps, NOW.replace(day=5))
    with pytest.raises(budget.CapRefusal) as refusal:
        budget.reserve(redis_conn, None, caps, NOW.replace(day=6))
    assert refusal.value.window == "week"
    budget.reserve(redis_conn, None, caps, NOW.replace(day=9))  # a new Monday week


def test_scope_cap_refuses_before_the_deployment_is_touched(redis_conn, settings):
    settings.PI_DAILY_CAP = 100
    limit = ScopedLimit.objects.create(scope="acme/web", day=2)
    caps = current()
    budget.reserve(redis_conn, limit, caps, NOW)
    budget.reserve(redis_conn, limit, caps, NOW)
    with pytest.raises(budget.CapRefusal) as refusal:
        budget.reserve(redis_conn, limit, caps, NOW)
    assert (refusal.value.reason, refusal.value.budget_reserved) == ("scope-cap", False)
    assert int(redis_conn.get(budget.window_keys("all", NOW)["day"])) == 2


def test_a_deployment_refusal_gives_the_scope_slot_back(redis_conn, settings):
    settings.PI_DAILY_CAP = 1
    limit = ScopedLimit.objects.create(scope="github:acme/web", day=5)
    caps = current()
    budget.reserve(redis_conn, limit, caps, NOW)
    with pytest.raises(budget.CapRefusal):
        budget.reserve(redis_conn, limit, caps, NOW)
    scope_key = budget.window_keys(f"s:{budget.scope_hash('github:acme/web')}", NOW)["day"]
    assert int(redis_conn.get(scope_key)) == 1


def test_limit_matching_prefers_the_forge_qualified_row():
    ScopedLimit.objects.create(scope="gitlab:acme/web", day=1)
    ScopedLimit.objects.create(scope="other/repo", day=1)
    assert budget.limit_for(forge_spec("gh-m1")) is None
    bare = ScopedLimit.objects.create(scope="acme/api", day=1)
    assert budget.limit_for(forge_spec("gh-m2", repo="acme/api")) == bare
    assert budget.limit_for(forge_spec("gl-m3", kind="gitlab")).scope == "gitlab:acme/web"


@pytest.mark.parametrize("fields, field, message", [
    (dict(scope="*", day=1), "scope", "not allowed"),
    (dict(scope="acme/w*", day=1), "scope", "globs"),
    (dict(scope="acme/web"), "day", "at least one"),
    (dict(scope="acme/web", day=0), "day", "at least 1"),
    (dict(scope="relative/../x", day=1), "scope", "not a scope"),
])
def test_invalid_limits_name_the_field_and_rule(fields, field, message):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as error:
        ScopedLimit(**fields).full_clean()
    assert message in " ".join(error.value.message_dict[field])


def test_bare_and_qualified_rows_for_one_repo_conflict():
    from django.core.exceptions import ValidationError

    ScopedLimit.objects.create(scope="acme/web", day=1)
    with pytest.raises(ValidationError, match="keep either the bare or the forge-qualified row"):
        ScopedLimit(scope="github:acme/web", week=1).full_clean()


def test_twenty_jobs_against_a_cap_of_five_across_four_workers_run_exactly_five(start_worker):
    for index in range(20):
        enqueue_spec(forge_spec(f"gh-race-{index}", number=100 + index))

    for _ in range(4):
        start_worker("pi-jobs", env={"PI_DAILY_CAP": "5"})

    from tests.conftest import wait_for
    wait_for(lambda: Run.objects.count() == 20, timeout=180, interval=0.5, what="20 run records")
    assert Run.objects.filter(outcome=Outcome.COMPLETED).count() == 5
    refused = Run.objects.filter(outcome=Outcome.POLICY)
    assert refused.count() == 15 and set(refused.values_list("reason", flat=True)) == {"over-budget"}
    assert set(refused.values_list("budget_reserved", flat=True)) == {True}


def test_a_container_that_never_started_gives_its_slot_back(run_worker, redis_conn, settings):
    engine = docker.from_env()
    holder = engine.containers.create(settings.PI_JOB_IMAGE)
    holder.commit(repository="pidispatch-broken", tag="test", changes=['ENTRYPOINT ["/no/such/runner"]'])
    holder.remove()
    job_id = enqueue_spec(forge_spec("gh-never", image="pidispatch-broken:test"))

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.FAILED, "container-never-started")
    day_key = budget.window_keys("all", datetime.now(UTC))["day"]
    assert int(redis_conn.get(day_key)) == 0
    assert engine.containers.list(all=True, filters={"name": f"pi-job-{job_id}"}) == []


def test_the_daily_token_cap_refuses_once_spent_and_runs_add_their_tokens(run_worker, redis_conn):
    now = datetime.now(UTC)
    ok = enqueue_spec(forge_spec("gh-tok1", body="fake-agent:tokens-in=700 fake-agent:tokens-out=300"))
    run_worker("pi-jobs", env_overrides={"PI_DAILY_TOKEN_CAP": "1000"})
    assert Run.objects.get(job_id=ok).outcome == Outcome.COMPLETED
    assert budget.tokens_spent_today(redis_conn, now) == 1000

    late = enqueue_spec(forge_spec("gh-tok2", number=8))
    run_worker("pi-jobs", env_overrides={"PI_DAILY_TOKEN_CAP": "1000"})
    assert (Run.objects.get(job_id=late).reason, Run.objects.get(job_id=late).budget_reserved) == (
        "daily-token-cap", False)


def test_the_settings_row_overrides_the_environment(run_worker):
    DispatchSettings.objects.create(daily_cap=1)
    first = enqueue_spec(forge_spec("gh-o1"))
    second = enqueue_spec(forge_spec("gh-o2", number=8))

    run_worker("pi-jobs")  # the environment allows 25 a day

    assert Run.objects.get(job_id=first).outcome == Outcome.COMPLETED
    assert Run.objects.get(job_id=second).reason == "over-budget"


def test_an_invalid_settings_row_refuses_every_job_before_any_spend(run_worker, redis_conn):
    DispatchSettings.objects.create(daily_cap=5)
    DispatchSettings.objects.update(soft_hold_pct=150, job_memory="lots")  # bypassing the form's validation
    job_id = enqueue_spec(forge_spec("gh-bad-settings"))

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "settings-overlay-invalid", False)
    assert redis_conn.get(budget.window_keys("all", datetime.now(UTC))["day"]) is None
