"""Pause windows: `[from, to)` in the window's zone, overnight, days and dates on the start day, DST, and
the worker deferring a job in an active window to the latest window end."""

import time
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from rq import Queue
from rq.registry import ScheduledJobRegistry

from apps.worker.gates.quiet_hours import active_until, paused_until
from apps.worker.models import Outcome, PauseWindow, Run
from tests.jobspecs import enqueue_spec, forge_spec

UTC = UTC


def window(scope="*", starts="22:00", ends="06:00", tz="UTC", days=(), date_from=None, date_to=None):
    return PauseWindow(scope=scope, starts=clock.fromisoformat(starts), ends=clock.fromisoformat(ends), tz=tz,
                       days=list(days), date_from=date_from, date_to=date_to)


def at(text: str, tz="UTC") -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).astimezone(UTC)


def test_same_day_window_is_half_open():
    office = window(starts="09:00", ends="17:00")
    assert active_until(office, at("2026-03-02T08:59")) is None
    assert active_until(office, at("2026-03-02T09:00")) == at("2026-03-02T17:00")
    assert active_until(office, at("2026-03-02T16:59")) == at("2026-03-02T17:00")
    assert active_until(office, at("2026-03-02T17:00")) is None


def test_overnight_window_spans_midnight_from_its_start_day():
    night = window(starts="22:00", ends="06:00", days=["fri"])  # 2026-03-06 is a Friday
    assert active_until(night, at("2026-03-06T23:30")) == at("2026-03-07T06:00")
    assert active_until(night, at("2026-03-07T05:59")) == at("2026-03-07T06:00")  # Saturday morning, started Friday
    assert active_until(night, at("2026-03-07T23:00")) is None  # Saturday's own night is not listed
    assert active_until(night, at("2026-03-06T05:00")) is None  # Friday morning belongs to Thursday's night


def test_date_range_gates_the_start_date():
    holiday = window(starts="00:00", ends="23:59", date_from=date(2026, 12, 24), date_to=date(2026, 12, 26))
    assert active_until(holiday, at("2026-12-23T12:00")) is None
    assert active_until(holiday, at("2026-12-24T12:00")) == at("2026-12-24T23:59")
    assert active_until(holiday, at("2026-12-26T23:59")) is None  # the last minute stays open
    assert active_until(holiday, at("2026-12-27T12:00")) is None


def test_windows_follow_their_zone_across_dst():
    amsterdam = window(starts="09:00", ends="10:00", tz="Europe/Amsterdam")
    # Winter (UTC+1) and summer (UTC+2): the same wall-clock hour, different instants.
    assert active_until(amsterdam, datetime(2026, 3, 27, 8, 30, tzinfo=UTC)) == datetime(2026, 3, 27, 9, 0, tzinfo=UTC)
    assert active_until(amsterdam, datetime(2026, 3, 30, 7, 30, tzinfo=UTC)) == datetime(2026, 3, 30, 8, 0, tzinfo=UTC)
    assert active_until(amsterdam, datetime(2026, 3, 30, 8, 30, tzinfo=UTC)) is None


def test_overnight_window_through_a_dst_change_ends_at_the_local_time():
    night = window(starts="22:00", ends="06:00", tz="Europe/Amsterdam")  # clocks go forward on 2026-03-29
    assert active_until(night, datetime(2026, 3, 28, 23, 0, tzinfo=UTC)) == datetime(2026, 3, 29, 4, 0, tzinfo=UTC)


def test_scope_matching_and_latest_end_wins():
    windows = [
        window(scope="acme/web", starts="09:00", ends="10:00"),
        window(scope="github:acme/web", starts="09:00", ends="11:00"),
        window(scope="gitlab:acme/web", starts="09:00", ends="12:00"),
        window(scope="/srv/app", starts="09:00", ends="13:00"),
    ]
    now = at("2026-03-02T09:30")
    assert paused_until(windows, ["github:acme/web", "acme/web"], now) == at("2026-03-02T11:00")
    assert paused_until(windows, ["gitlab:acme/web", "acme/web"], now) == at("2026-03-02T12:00")
    assert paused_until(windows, ["other/repo"], now) is None
    assert paused_until(windows + [window(scope="*", starts="09:00", ends="09:45")], ["other/repo"], now) == at(
        "2026-03-02T09:45")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields, field, message",
    [
        (dict(starts="09:00", ends="09:00"), "ends", "cannot last 24 hours"),
        (dict(tz="Mars/Olympus"), "tz", "IANA"),
        (dict(scope="acme/*"), "scope", "globs"),
        (dict(scope="svn:acme/web"), "scope", "unknown forge prefix"),
        (dict(scope="web"), "scope", "owner/repo"),
        (dict(days=["funday"]), "days", "weekday"),
        (dict(date_from=date(2026, 2, 1), date_to=date(2026, 1, 1)), "date_to", "on or after"),
    ],
)
def test_invalid_windows_say_which_field_and_why(fields, field, message):
    with pytest.raises(ValidationError) as error:
        window(**fields).full_clean()
    assert message in " ".join(error.value.message_dict[field])


@pytest.mark.django_db
def test_valid_window_is_normalised():
    ok = window(scope="/srv/app/../app2/", days=["Monday", "FRI"])
    ok.full_clean()
    assert ok.scope == "/srv/app2" and ok.days == ["mon", "fri"]


@pytest.mark.django_db(transaction=True)
def test_a_job_in_an_active_window_is_deferred_to_its_end_then_runs(run_worker, redis_conn):
    now = datetime.now(UTC)
    # A window to the minute that still has a minute at least to go: the worker's start must land inside it.
    end = (now + timedelta(minutes=2)).replace(second=0, microsecond=0)
    PauseWindow.objects.create(scope="acme/web",
                               starts=(now - timedelta(minutes=1)).time().replace(second=0, microsecond=0),
                               ends=end.time(), tz="UTC")
    job_id = enqueue_spec(forge_spec("gh-quiet"))

    run_worker("pi-jobs")

    assert not Run.objects.filter(job_id=job_id).exists()  # a deferral writes no record
    registry = ScheduledJobRegistry(queue=Queue("pi-jobs", connection=redis_conn))
    assert registry.get_job_ids() == [job_id]
    wake = registry.get_scheduled_time(job_id)
    assert abs((wake - end).total_seconds()) <= 1

    PauseWindow.objects.all().delete()  # the window ends early: the job still waits for its wake-up
    run_worker("pi-jobs")
    assert not Run.objects.filter(job_id=job_id).exists()

    registry.schedule(Queue("pi-jobs", connection=redis_conn).fetch_job(job_id), datetime.now(UTC))
    time.sleep(1.1)
    run_worker("pi-jobs")
    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
