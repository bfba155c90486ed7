"""Pause windows (quiet hours): `[from, to)` in the window's own time zone, overnight when from > to.

`days` and the date range gate the day an occurrence STARTS, so an overnight window that starts on
Friday runs into Saturday morning even when Saturday is not listed. Everything is computed in the
window's zone and compared as instants, so DST changes move the wall clock, not the rule.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ValidationError

from apps.worker.gates.scopes import EVERYTHING, ScopeError, parse_scope

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def validate_window(window) -> None:
    errors = {}
    try:
        window.scope = parse_scope(window.scope, allow_everything=True)
    except ScopeError as exc:
        errors["scope"] = str(exc)
    for name in ("starts", "ends"):
        value = getattr(window, name)
        if value is not None and (value.second or value.microsecond):
            errors[name] = "use whole minutes (HH:MM)."
    if window.starts is not None and window.ends is not None and window.starts == window.ends:
        errors["ends"] = "'to' equals 'from': a window cannot last 24 hours; use two windows or a pause."
    try:
        ZoneInfo(window.tz or "")
    except (ZoneInfoNotFoundError, ValueError):
        errors["tz"] = f"{window.tz!r} is not an IANA time zone name (e.g. Europe/Amsterdam, UTC)."
    days = window.days
    if not isinstance(days, list) or any(not isinstance(day, str) or day.lower()[:3] not in WEEKDAYS for day in days):
        errors["days"] = 'a list of weekday names such as ["mon", "fri"], or empty for every day.'
    else:
        window.days = [day.lower()[:3] for day in days]
    if window.date_from and window.date_to and window.date_from > window.date_to:
        errors["date_to"] = "must be on or after date_from."
    if errors:
        raise ValidationError(errors)


def _occurrence(window, start_day: date, zone: ZoneInfo) -> tuple[datetime, datetime] | None:
    if window.days and WEEKDAYS[start_day.weekday()] not in window.days:
        return None
    if window.date_from and start_day < window.date_from:
        return None
    if window.date_to and start_day > window.date_to:
        return None
    start = datetime.combine(start_day, window.starts, tzinfo=zone)
    end_day = start_day + timedelta(days=1) if window.ends < window.starts else start_day
    end = datetime.combine(end_day, window.ends, tzinfo=zone)
    return start.astimezone(UTC), end.astimezone(UTC)


def active_until(window, now: datetime) -> datetime | None:
    """The end of the occurrence of `window` that contains `now`, if any."""
    zone = ZoneInfo(window.tz)
    today = now.astimezone(zone).date()
    for start_day in (today - timedelta(days=1), today):
        occurrence = _occurrence(window, start_day, zone)
        if occurrence and occurrence[0] <= now < occurrence[1]:
            return occurrence[1]
    return None


def applies_to(window, candidate_scopes: list[str]) -> bool:
    return window.scope == EVERYTHING or window.scope in candidate_scopes


def paused_until(windows, candidate_scopes: list[str], now: datetime) -> datetime | None:
    """The latest end among the active windows that cover the job, or None when none does."""
    ends = [
        end
        for window in windows
        if applies_to(window, candidate_scopes) and (end := active_until(window, now)) is not None
    ]
    return max(ends, default=None)
