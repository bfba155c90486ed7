"""Job-count caps and the daily token cap, as atomic Redis counters on UTC calendar windows.

Keys (TTL set once, when the counter is created, so a busy window cannot push its own expiry):
    pidispatch:budget:<ledger>:d:<YYYY-MM-DD>     2 days
    pidispatch:budget:<ledger>:w:<Monday date>    9 days
    pidispatch:budget:<ledger>:m:<YYYY-MM>        40 days
    pidispatch:budget:tokens:<YYYY-MM-DD>         2 days
where <ledger> is `all` (the deployment) or `s:<hash16 of the matched limit's scope>`.

Rules (the ancestor's): every reservation increments, and a refused one still counts; the narrowest
ledger is reserved first and a wider refusal gives the narrower slots back; slots are given back only
when no container ever started. Twenty racers against a cap of five: exactly five pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError

from .jobs import JobSpec
from .scopes import ScopeError, bare_repo, job_scopes, parse_scope, scope_hash

PREFIX = "pidispatch:budget"
DAY, WEEK, MONTH = "day", "week", "month"
TTL_SECONDS = {DAY: 2 * 86400, WEEK: 9 * 86400, MONTH: 40 * 86400}


@dataclass(frozen=True)
class Window:
    name: str
    key: str
    cap: int


def window_keys(ledger: str, now: datetime) -> dict[str, str]:
    day = now.date()
    monday = day - timedelta(days=day.weekday())
    return {
        DAY: f"{PREFIX}:{ledger}:d:{day.isoformat()}",
        WEEK: f"{PREFIX}:{ledger}:w:{monday.isoformat()}",
        MONTH: f"{PREFIX}:{ledger}:m:{day:%Y-%m}",
    }


def _windows(ledger: str, caps: dict[str, int | None], now: datetime) -> list[Window]:
    keys = window_keys(ledger, now)
    return [Window(name, keys[name], cap) for name, cap in caps.items() if cap]


def _increment(redis, windows: list[Window]) -> list[int]:
    with redis.pipeline(transaction=True) as pipe:
        for window in windows:
            pipe.incr(window.key)
            pipe.expire(window.key, TTL_SECONDS[window.name], nx=True)
        results = pipe.execute()
    return results[0::2]


def _give_back(redis, keys: list[str]) -> None:
    if keys:
        with redis.pipeline(transaction=True) as pipe:
            for key in keys:
                pipe.decr(key)
            pipe.execute()


class CapRefusal(Exception):
    def __init__(self, reason: str, window: str, budget_reserved: bool):
        super().__init__(reason)
        self.reason = reason
        self.window = window
        self.budget_reserved = budget_reserved


@dataclass
class Reservation:
    keys: list[str] = field(default_factory=list)

    def give_back(self, redis) -> None:
        """Only for a job whose container never started."""
        _give_back(redis, self.keys)
        self.keys = []


def reserve(redis, limit, caps, now: datetime) -> Reservation:
    """Reserve one run in the matched scoped limit (if any), then in the deployment's windows.

    Raises CapRefusal(`scope-cap` | `over-budget` | `soft-hold`).
    """
    held: list[str] = []
    if limit is not None:
        windows = _windows(f"s:{scope_hash(limit.scope)}", {DAY: limit.day, WEEK: limit.week, MONTH: limit.month}, now)
        counts = _increment(redis, windows)
        for window, count in zip(windows, counts):
            if count > window.cap:
                raise CapRefusal("scope-cap", window.name, budget_reserved=False)
        held = [window.key for window in windows]

    windows = _windows("all", {DAY: caps.daily_cap, WEEK: caps.weekly_cap, MONTH: caps.monthly_cap}, now)
    counts = _increment(redis, windows)
    over = [window for window, count in zip(windows, counts) if count > window.cap]
    soft = [
        window for window, count in zip(windows, counts)
        if caps.soft_hold_pct and count > window.cap * caps.soft_hold_pct // 100
    ]
    if over or soft:
        _give_back(redis, held)
        reason, window = ("over-budget", over[0]) if over else ("soft-hold", soft[0])
        raise CapRefusal(reason, window.name, budget_reserved=True)
    return Reservation(held + [window.key for window in windows])


def deployment_counts(redis, now: datetime) -> dict[str, int]:
    """Runs reserved so far in the deployment's current day, week and month (refusals included)."""
    keys = window_keys("all", now)
    values = redis.mget([keys[DAY], keys[WEEK], keys[MONTH]])
    return {name: int(value or 0) for name, value in zip((DAY, WEEK, MONTH), values)}


# --- daily tokens -----------------------------------------------------------------------------------

def tokens_key(now: datetime) -> str:
    return f"{PREFIX}:tokens:{now.date().isoformat()}"


def tokens_spent_today(redis, now: datetime) -> int:
    return int(redis.get(tokens_key(now)) or 0)


def record_tokens(redis, tokens: int, now: datetime) -> None:
    if tokens:
        key = tokens_key(now)
        with redis.pipeline(transaction=True) as pipe:
            pipe.incrby(key, tokens)
            pipe.expire(key, TTL_SECONDS[DAY], nx=True)
            pipe.execute()


# --- scoped limits --------------------------------------------------------------------------------

def validate_limit(limit) -> None:
    from .models import ScopedLimit

    errors = {}
    try:
        limit.scope = parse_scope(limit.scope, allow_everything=False)
    except ScopeError as exc:
        errors["scope"] = str(exc)
    values = {name: getattr(limit, name) for name in ("day", "week", "month", "concurrent")}
    for name, value in values.items():
        if value is not None and value < 1:
            errors[name] = "must be at least 1 (leave it blank for no limit)."
    if all(value is None for value in values.values()):
        errors["day"] = "set at least one of day, week, month or concurrent."
    if "scope" not in errors and not limit.scope.startswith("/"):
        # A bare row and a forge-qualified row for one repo would make two answers to "which cap applies".
        repo = bare_repo(limit.scope)
        siblings = ScopedLimit.objects.exclude(pk=limit.pk).filter(scope__endswith=repo)
        clash = next((row.scope for row in siblings if bare_repo(row.scope) == repo and row.scope != limit.scope), None)
        if clash:
            errors["scope"] = f"conflicts with the limit for {clash}: keep either the bare or the forge-qualified row."
    if errors:
        raise ValidationError(errors)


def limit_for(spec: JobSpec):
    """The scoped limit that applies to a job: forge-qualified row first, then the bare repo row."""
    from .models import ScopedLimit

    candidates = job_scopes(spec)
    rows = {row.scope: row for row in ScopedLimit.objects.filter(scope__in=candidates)}
    return next((rows[scope] for scope in candidates if scope in rows), None)
