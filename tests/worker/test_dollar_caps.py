"""Dollar caps: each job's per-job cap held in every dollar window before its container (integer micro-dollars,
one Lua script, all or none), settled after it to the gateway's metered cost, or kept whole when the cost cannot
be known; a window without a per-job cap is refused where it is set. Real Redis, real worker processes."""

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.worker.gates import budget, money, runtime_settings
from apps.worker.gates.checks import dollar_settings
from apps.worker.models import DispatchSettings, Outcome, Run, ScopedLimit
from tests.conftest import ROOT, wait_for
from tests.jobspecs import enqueue_spec, forge_spec
from tests.process_support import horse_of

pytestmark = pytest.mark.django_db(transaction=True)
NOW = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)  # a Wednesday


def window(redis, ledger="all", name="day", now=NOW) -> tuple[int, int]:
    """(used, held) micro-dollars of one dollar window."""
    used, held = redis.hmget(budget.usd_window_keys(ledger, now)[name], "used", "held")
    return int(used or 0), int(held or 0)


def today(redis) -> tuple[int, int]:
    return window(redis, now=datetime.now(UTC))


# --- amounts -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, micros", [("2.50", 2_500_000), (1, 1_000_000), ("0.000001", 1), (0.1, 100_000),
                                           (Decimal("3.000000"), 3_000_000), ("1000000", 10**12), ("", None)])
def test_dollar_amounts_are_exact_micro_dollars(value, micros):
    assert money.parse_usd(value) == micros


@pytest.mark.parametrize("value, rule", [("0", "more than 0"), ("-1", "is negative"), ("1e3", "plain number"),
                                         ("0.0000001", "at most 6 decimals"), ("1000000.01", "at most 1000000"),
                                         (True, "not true/false"), ("two", "plain number"), (float("nan"), "finite")])
def test_a_bad_dollar_amount_names_the_rule(value, rule):
    with pytest.raises(money.MoneyError, match=rule):
        money.parse_usd(value)


# --- reserve and settle --------------------------------------------------------------------------------

def test_the_hold_goes_into_every_window_or_none(redis_conn, settings):
    settings.PI_MAX_COST_USD, settings.PI_DAILY_COST_USD = "1", "5"
    limit = ScopedLimit.objects.create(scope="acme/web", day_usd=Decimal("2.5"))
    runtime = runtime_settings.current()
    scope = f"s:{budget.scope_hash('acme/web')}"
    budget.reserve_dollars(redis_conn, forge_spec("gh-d1"), limit, runtime, NOW)
    budget.reserve_dollars(redis_conn, forge_spec("gh-d2"), limit, runtime, NOW)

    with pytest.raises(budget.DollarRefusal) as refusal:  # $2 held of the repository's $2.50: no room for $1
        budget.reserve_dollars(redis_conn, forge_spec("gh-d3"), limit, runtime, NOW)

    assert refusal.value.reason == "dollar-cap" and refusal.value.window.ledger == scope
    assert window(redis_conn, scope) == (0, 2_000_000)
    assert window(redis_conn) == (0, 2_000_000)  # the deployment's window was not touched by the refusal
    assert redis_conn.exists(budget.hold_key("gh-d3")) == 0
    ttl = redis_conn.ttl(budget.usd_window_keys("all", NOW)["day"])
    assert 86400 < ttl <= 2 * 86400


def test_settle_charges_the_metered_cost_exactly_and_releases_the_rest(redis_conn, settings):
    settings.PI_MAX_COST_USD, settings.PI_DAILY_COST_USD, settings.PI_MONTHLY_COST_USD = "1", "5", "100"
    hold = budget.reserve_dollars(redis_conn, forge_spec("gh-s1"), None, runtime_settings.current(), NOW)
    assert window(redis_conn) == (0, 1_000_000) and window(redis_conn, name="month") == (0, 1_000_000)

    budget.settle_dollars(redis_conn, hold, ran=True, cost=Decimal("0.0048004"))  # rounded up, never down
    budget.settle_dollars(redis_conn, hold, ran=True, cost=Decimal("0.9"))  # once: a second settle changes nothing

    assert window(redis_conn) == (4801, 0) and window(redis_conn, name="month") == (4801, 0)
    assert hold.record_fields() == {"dollars_reserved": Decimal("1.000000"), "dollars_charged": Decimal("0.004801"),
                                    "dollar_basis": "metered"}
    assert redis_conn.exists(budget.hold_key("gh-s1")) == 0


def test_an_unknown_cost_keeps_the_whole_hold_and_a_run_that_never_started_is_refunded(redis_conn, settings):
    settings.PI_MAX_COST_USD, settings.PI_DAILY_COST_USD = "1.25", "5"
    runtime = runtime_settings.current()
    unknown = budget.reserve_dollars(redis_conn, forge_spec("gh-f1"), None, runtime, NOW)
    never = budget.reserve_dollars(redis_conn, forge_spec("gh-f2"), None, runtime, NOW)

    budget.settle_dollars(redis_conn, unknown, ran=True, cost=None)
    budget.settle_dollars(redis_conn, never, ran=False, cost=None)

    assert window(redis_conn) == (1_250_000, 0)
    assert unknown.record_fields()["dollar_basis"] == "floor" and never.record_fields()["dollar_basis"] == "refunded"


def test_a_trigger_lowers_the_per_job_cap_and_never_raises_it(settings):
    settings.PI_MAX_COST_USD = "2"
    runtime = runtime_settings.current()
    assert budget.job_cost_cap(forge_spec("gh-t1", max_cost_usd="0.5"), runtime) == 500_000
    assert budget.job_cost_cap(forge_spec("gh-t2", max_cost_usd="20"), runtime) == 2_000_000
    assert budget.job_cost_cap(forge_spec("gh-t3"), runtime) == 2_000_000
    settings.PI_MAX_COST_USD = ""
    assert budget.job_cost_cap(forge_spec("gh-t4", max_cost_usd="0.75"), runtime_settings.current()) == 750_000


def test_a_scoped_dollar_row_without_any_per_job_cap_refuses_the_job_naming_what_to_set(redis_conn):
    limit = ScopedLimit.objects.create(scope="acme/web", week_usd=Decimal("10"))
    with pytest.raises(budget.DollarRefusal) as refusal:
        budget.reserve_dollars(redis_conn, forge_spec("gh-u1"), limit, runtime_settings.current(), NOW)
    assert refusal.value.reason == "cost-cap-unset"
    # The trigger's cap is enough.
    budget.reserve_dollars(redis_conn, forge_spec("gh-u2", max_cost_usd="1"), limit, runtime_settings.current(), NOW)


def test_the_windows_in_force_say_cap_used_and_held(redis_conn, settings):
    settings.PI_MAX_COST_USD, settings.PI_DAILY_COST_USD = "1", "5"
    DispatchSettings.objects.create(weekly_cost_usd=Decimal("20"))
    ScopedLimit.objects.create(scope="acme/web", month_usd=Decimal("7.5"))
    now = datetime.now(UTC)
    runtime = runtime_settings.current()
    limit = ScopedLimit.objects.get()
    settled = budget.reserve_dollars(redis_conn, forge_spec("gh-w1"), limit, runtime, now)
    budget.settle_dollars(redis_conn, settled, ran=True, cost=Decimal("0.25"))
    budget.reserve_dollars(redis_conn, forge_spec("gh-w2"), None, runtime, now)

    found = {(w.ledger, w.window): (w.cap, w.used, w.held) for w in budget.dollar_windows_in_force(redis_conn)}

    assert found == {("all", "day"): (Decimal("5"), Decimal("0.25"), Decimal("1")),
                     ("all", "week"): (Decimal("20"), Decimal("0.25"), Decimal("1")),
                     (f"s:{budget.scope_hash('acme/web')}", "month"): (Decimal("7.5"), Decimal("0.25"), Decimal("0"))}


# --- where a window is set without a per-job cap ---------------------------------------------------------

def test_an_environment_window_without_a_per_job_cap_fails_the_check(settings):
    settings.PI_WEEKLY_COST_USD = "50"
    (error,) = dollar_settings(None)
    assert error.id == "worker.E010" and "PI_WEEKLY_COST_USD" in error.msg and "set PI_MAX_COST_USD" in error.msg
    settings.PI_MAX_COST_USD = "2"
    assert dollar_settings(None) == []
    settings.PI_MAX_COST_USD = "2.0000001"
    (error,) = dollar_settings(None)
    assert "PI_MAX_COST_USD must be a plain number of dollars with at most 6 decimals" in error.msg


def test_a_window_smaller_than_the_per_job_cap_is_named_where_it_is_set(settings):
    settings.PI_MAX_COST_USD, settings.PI_DAILY_COST_USD = "5", "2"
    (warning,) = dollar_settings(None)
    assert warning.id == "worker.W002" and "PI_DAILY_COST_USD is smaller than PI_MAX_COST_USD" in warning.msg
    with pytest.raises(ValidationError, match="smaller than the max cost per run"):
        DispatchSettings(max_cost_usd=Decimal("1"), weekly_cost_usd=Decimal("0.5")).full_clean()
    DispatchSettings(max_cost_usd=Decimal("1")).full_clean()  # the row lowers the per-run cap under $2 a day


def test_every_process_refuses_to_start_with_such_a_window(worker_env):
    env = {**worker_env, "PI_DAILY_COST_USD": "10", "PI_MAX_COST_USD": ""}
    starts = {
        "check": [sys.executable, "manage.py", "check"],
        "worker": [sys.executable, "manage.py", "rqworker", "pi-jobs", "--burst"],
        "cron": [sys.executable, "manage.py", "run_cron", "--once"],
        "web": [sys.executable, "-c", "import pidispatch_site.wsgi"],
    }
    for name, command in starts.items():
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0, name
        assert "PI_DAILY_COST_USD set without a per-job cap: set PI_MAX_COST_USD" in result.stderr, (
            name, result.stderr)


def test_a_live_window_without_a_per_job_cap_refuses_every_job(run_worker, redis_conn):
    row = DispatchSettings(daily_cost_usd=Decimal("10"))
    with pytest.raises(ValidationError, match="a dollar window needs a per-job cap: set the max cost per run"):
        row.full_clean()
    row.save()  # as a row written around the admin's form would be
    job_id = enqueue_spec(forge_spec("gh-live-window"))

    worker = run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "settings-overlay-invalid", False)
    assert "daily_cost_usd: a dollar window needs a per-job cap: set the max cost per run here (or PI_MAX_COST_USD)" \
        in worker.stderr + worker.stdout
    assert today(redis_conn) == (0, 0)


# --- real workers -----------------------------------------------------------------------------------

@pytest.mark.docker
def test_twenty_jobs_racing_a_daily_dollar_window_across_four_workers_never_overspend(start_worker, redis_conn):
    """$1 per job against $4.99 a day: a fifth job would pass the window by one cent, so exactly four run. The demo
    image's runs go through no gateway, so their cost cannot be known and each keeps its whole hold."""
    for index in range(20):
        enqueue_spec(forge_spec(f"gh-usd-{index}", number=200 + index))
    started = time.monotonic()
    for _ in range(4):
        start_worker("pi-jobs", env={"PI_MAX_COST_USD": "1", "PI_DAILY_COST_USD": "4.99"})

    wait_for(lambda: Run.objects.count() == 20, timeout=180, interval=0.5, what="20 run records")
    elapsed = time.monotonic() - started

    ran = Run.objects.filter(outcome=Outcome.COMPLETED)
    assert ran.count() == 4
    assert set(ran.values_list("dollar_basis", "dollars_reserved", "dollars_charged")) == {
        ("floor", Decimal("1"), Decimal("1"))}
    refused = Run.objects.filter(outcome=Outcome.POLICY)
    assert refused.count() == 16 and set(refused.values_list("reason", flat=True)) == {"dollar-cap"}
    assert set(refused.values_list("budget_reserved", "dollar_basis")) == {(False, "")}
    used, held = today(redis_conn)
    assert (used, held) == (4_000_000, 0) and used + held <= 4_990_000
    print(f"\n20 jobs, 4 workers, $4.99 window: {elapsed:.1f} s to 20 records")


@pytest.mark.docker
def test_a_job_count_refusal_after_the_dollar_hold_gives_the_hold_back(run_worker, redis_conn):
    DispatchSettings.objects.create(daily_cap=1, max_cost_usd=Decimal("0.4"), daily_cost_usd=Decimal("3"))
    first = enqueue_spec(forge_spec("gh-usd-count-1"))
    second = enqueue_spec(forge_spec("gh-usd-count-2", number=8))

    run_worker("pi-jobs")  # the settings row's caps, live

    assert Run.objects.get(job_id=first).dollar_basis == "floor"
    refused = Run.objects.get(job_id=second)
    assert (refused.reason, refused.dollar_basis, refused.dollars_charged) == ("over-budget", "refunded", Decimal(0))
    assert today(redis_conn) == (400_000, 0)
    assert redis_conn.exists(budget.hold_key(second)) == 0


@pytest.mark.docker
def test_a_crash_between_reserve_and_settle_charges_the_whole_hold(start_worker, redis_conn, fast_fleet,
                                                                   job_containers):
    worker = start_worker("pi-jobs", "pi-jobs@hostA",
                          env={"PI_WORKER_NAME": "hostA", "PI_MAX_COST_USD": "2.5", "PI_DAILY_COST_USD": "10",
                               "PI_LOST_RETRIES": "0"})
    job_id = enqueue_spec(forge_spec("gh-usd-crash", body="fake-agent:sleep=60"))
    wait_for(lambda: job_containers("hostA").get(job_id), timeout=90, what="the job's container")
    assert today(redis_conn) == (0, 2_500_000)

    os.kill(horse_of(worker.pid), 9)

    (run,) = wait_for(lambda: list(Run.objects.filter(job_id=job_id)), timeout=30, what="the record")
    assert (run.outcome, run.reason) == (Outcome.FAILED, "worker-lost")
    assert (run.dollar_basis, run.dollars_reserved, run.dollars_charged) == ("floor", Decimal("2.5"), Decimal("2.5"))
    # Its container may have spent it all: the worker that settled the lost attempt charged the whole hold.
    assert today(redis_conn) == (2_500_000, 0)
    assert redis_conn.exists(budget.hold_key(job_id)) == 0


def test_the_settings_page_takes_the_dollar_caps_and_refuses_a_window_without_a_per_run_cap(admin_client):
    bad = admin_client.post("/admin/worker/dispatchsettings/1/change/", {"daily_cost_usd": "10", "job_memory": ""})
    assert "a dollar window needs a per-job cap" in bad.content.decode() and not DispatchSettings.objects.exists()

    admin_client.post("/admin/worker/dispatchsettings/1/change/", {"daily_cost_usd": "10", "max_cost_usd": "0.5",
                                                                   "job_memory": ""})
    page = admin_client.get("/admin/worker/dispatchsettings/1/change/").content.decode()
    assert "max cost usd: 0.500000" in page and "daily cost usd: 10.000000" in page


def test_a_scoped_limit_takes_dollar_windows_in_the_admin(admin_client, settings):
    settings.PI_MAX_COST_USD = "1"
    bad = admin_client.post("/admin/worker/scopedlimit/add/", {"scope": "acme/web", "day_usd": "0"})
    assert "must be more than 0" in bad.content.decode()
    admin_client.post("/admin/worker/scopedlimit/add/", {"scope": "acme/web", "week_usd": "12.5"})
    assert ScopedLimit.objects.get().week_usd == Decimal("12.5")


def test_an_attempt_in_flight_when_redis_lost_its_data_keeps_its_hold_and_settles_it(redis_conn, settings):
    """The rebuild holds the per-job cap of each attempt that had taken its budget again (its hold is written anew,
    so its settlement moves it to `used`); an attempt still in its gates is not counted (it reserves for itself
    next); a hold of a job that holds again after the rebuild is charged whole before its new one."""
    from apps.worker import accepted
    from apps.worker.gates import budget_rebuild

    settings.PI_MAX_COST_USD, settings.PI_DAILY_COST_USD = "1", "5"
    now = datetime.now(UTC)
    for job_id in ("gh-flying", "gh-in-gates", "gh-again"):
        enqueue_spec(forge_spec(job_id), "pi-jobs")
        accepted.started(job_id, 1)
    accepted.spending("gh-flying")
    accepted.spending("gh-again")
    redis_conn.flushdb()  # Redis came back empty while the three were on a worker

    assert budget_rebuild.ensure_rebuilt(redis_conn, now)
    assert not budget_rebuild.ensure_rebuilt(redis_conn, now)  # once per Redis process
    assert today(redis_conn) == (0, 2_000_000)
    assert redis_conn.get(budget.window_keys("all", now)["day"]) == b"2"

    hold = budget.DollarHold("gh-flying", 1_000_000, keys=[budget.usd_window_keys("all", now)["day"]])
    budget.settle_dollars(redis_conn, hold, ran=True, cost=Decimal("0.25"))
    assert today(redis_conn) == (250_000, 1_000_000)
    budget.reserve_dollars(redis_conn, forge_spec("gh-again"), None, runtime_settings.current(), now)
    assert today(redis_conn) == (1_250_000, 1_000_000)  # its rebuilt hold charged whole, its new one held
