"""Job-count caps, the daily token cap and the dollar caps, as atomic Redis counters on UTC calendar windows.

Keys (TTL set once, when the counter is created, so a busy window cannot push its own expiry):
    pidispatch:budget:<ledger>:d:<YYYY-MM-DD>       2 days   runs reserved (a string counter)
    pidispatch:budget:<ledger>:w:<Monday date>      9 days
    pidispatch:budget:<ledger>:m:<YYYY-MM>          40 days
    pidispatch:budget:tokens:<YYYY-MM-DD>           2 days   tokens spent across all runs, and the worst case of
                                                             the provider calls in flight (reserve_call_tokens)
    pidispatch:budget:usd:<ledger>:d:<YYYY-MM-DD>   2 days   a hash of integer micro-dollars: `held` (reserved by
    pidispatch:budget:usd:<ledger>:w:<Monday date>  9 days   runs not settled yet) and `used` (what settled runs
    pidispatch:budget:usd:<ledger>:m:<YYYY-MM>      40 days  were charged)
    pidispatch:budget:usd:hold:<job id>             40 days  one job's open hold: `amount` (micro-dollars) and
                                                             `keys` (the window keys it is held in, space-separated)
where <ledger> is `all` (the deployment) or `s:<hash16 of the matched limit's scope>` (a repository's or
folder's row, a `project:<id>` row, a `model:<provider>/<model>` row). dollar_windows_in_force()
reads the dollar windows (for the cost page and /metrics).

Job counts (the ancestor's rules): every reservation increments, and a refused one still counts; the narrowest
ledger is reserved first and a wider refusal gives the narrower slots back; slots are given back only
when no container ever started. Twenty racers against a cap of five: exactly five pass.

Dollars: before the container the job's per-job cap is held in every dollar window that applies, by one Lua
script that first checks every window has room (used + held + cap <= window cap): all or nothing, so a refusal
(`dollar-cap`) leaves nothing held. After the run, settle_dollars moves the hold to `used`, charged the metered
cost (rounded up to the micro-dollar) or, when the cost cannot be known, the whole hold (`floor`); a job whose
container never ran is refunded. The hold of an attempt whose worker died is charged whole by whoever settles the
lost attempt (charge_lost_hold), before the job may run again and hold anew.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cache

from django.db.models import Q
from django.dispatch import Signal
from django.utils import timezone

from apps.worker.gates import money
from apps.worker.gates.scopes import MODEL_PREFIX, PROJECT_PREFIX, job_scopes, scope_hash
from apps.worker.jobs import JobSpec

PREFIX = "pidispatch:budget"

# Sent when a job is held `soft-hold` (kwargs: window: "day" | "week" | "month", period: the window's start as its
# key names it, e.g. "2026-12-03", job_id). The notifications app sends one notification per window from it.
soft_hold_reached = Signal()
USD_PREFIX = f"{PREFIX}:usd"
logger = logging.getLogger("pidispatch.budget")
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


@dataclass(frozen=True)
class MatchedRows:
    """The scoped-limit rows one job answers to (rows_for)."""

    scope: object = None  # ScopedLimit of the job's repository or folder
    project: object = None  # ScopedLimit `project:<id>` of the project the job was stamped with
    models: tuple = ()  # ScopedLimit `model:<provider>/<model>` rows (dollar windows only)

    def calling(self, models: tuple[str, ...] | None) -> MatchedRows:
        """Only the model rows of `models` (`provider/model`); None: the job may call any model, so it answers
        to every model row, as the ancestor reserves."""
        if models is None:
            return self
        names = {f"{MODEL_PREFIX}{model.lower()}" for model in models}
        return replace(self, models=tuple(row for row in self.models if row.scope in names))

    @classmethod
    def of(cls, rows) -> MatchedRows:
        """`rows` as MatchedRows: a lone ScopedLimit is the job's own scope's row; None is no row."""
        return rows if isinstance(rows, MatchedRows) else cls(scope=rows)


class CapRefusal(Exception):
    def __init__(self, reason: str, window: str, budget_reserved: bool, counted: list[str] | None = None):
        super().__init__(reason)
        self.reason = reason
        self.window = window
        self.budget_reserved = budget_reserved
        self.counted = counted or []  # the window keys the refused attempt still counts in (its own ledger's)


@dataclass
class Reservation:
    keys: list[str] = field(default_factory=list)

    def give_back(self, redis) -> None:
        """Only for a job whose container never started."""
        _give_back(redis, self.keys)
        self.keys = []


def reserve(redis, rows: MatchedRows, caps, now: datetime) -> Reservation:
    """Reserve one run in the matched scoped limit (if any), its project's row (if any), then in the deployment's
    windows. A refusal gives back the narrower slots taken before it (never its own: a refused attempt counts).

    Raises CapRefusal(`scope-cap` | `project-cap` | `over-budget` | `soft-hold`).
    """
    held: list[str] = []
    rows = MatchedRows.of(rows)
    for limit, reason in ((rows.scope, "scope-cap"), (rows.project, "project-cap")):
        if limit is None:
            continue
        windows = _windows(f"s:{scope_hash(limit.scope)}", {DAY: limit.day, WEEK: limit.week, MONTH: limit.month}, now)
        counts = _increment(redis, windows)
        over = next((window for window, count in zip(windows, counts, strict=True) if count > window.cap), None)
        if over is not None:
            _give_back(redis, held)
            raise CapRefusal(reason, over.name, budget_reserved=False, counted=[window.key for window in windows])
        held += [window.key for window in windows]

    windows = _windows("all", {DAY: caps.daily_cap, WEEK: caps.weekly_cap, MONTH: caps.monthly_cap}, now)
    counts = _increment(redis, windows)
    over = [window for window, count in zip(windows, counts, strict=True) if count > window.cap]
    soft = [
        window for window, count in zip(windows, counts, strict=True)
        if caps.soft_hold_pct and count > window.cap * caps.soft_hold_pct // 100
    ]
    if over or soft:
        _give_back(redis, held)
        reason, window = ("over-budget", over[0]) if over else ("soft-hold", soft[0])
        raise CapRefusal(reason, window.name, budget_reserved=True, counted=[window.key for window in windows])
    return Reservation(held + [window.key for window in windows])


def ledgers_of(keys) -> list[str]:
    """The ledgers (`all`, `s:<hash16>`) of window keys, job-count or dollar, in their order, once each: what a run
    record keeps of where it counted (apps/worker/gates/budget_rebuild.py rebuilds the windows from it)."""
    found = []
    for key in keys:
        ledger = key.removeprefix(f"{USD_PREFIX}:").removeprefix(f"{PREFIX}:").rsplit(":", 2)[0]
        if ledger not in found:
            found.append(ledger)
    return found


def deployment_counts(redis, now: datetime) -> dict[str, int]:
    """Runs reserved so far in the deployment's current day, week and month (refusals included)."""
    keys = window_keys("all", now)
    values = redis.mget([keys[DAY], keys[WEEK], keys[MONTH]])
    return {name: int(value or 0) for name, value in zip((DAY, WEEK, MONTH), values, strict=True)}


# --- daily tokens -----------------------------------------------------------------------------------

def tokens_key(now: datetime) -> str:
    return f"{PREFIX}:tokens:{now.date().isoformat()}"


def tokens_spent_today(redis, now: datetime) -> int:
    return int(redis.get(tokens_key(now)) or 0)


def record_tokens(redis, tokens: int, now: datetime) -> None:
    add_tokens(redis, tokens_key(now), tokens)


def add_tokens(redis, key: str, tokens: int) -> None:
    """Add to a day's token counter (a negative amount gives back what a call's reservation did not use)."""
    if tokens:
        with redis.pipeline(transaction=True) as pipe:
            pipe.incrby(key, tokens)
            pipe.expire(key, TTL_SECONDS[DAY], nx=True)
            pipe.execute()


# KEYS[1] the day's token counter; ARGV the call's input bound, the output it asks for (-1: none), the least
# output worth forwarding, the day's cap, the counter's TTL. Returns the output granted (its input plus that
# output now counted), or -1 when the day has no room for it (nothing counted).
_RESERVE_CALL_TOKENS = """
local room = tonumber(ARGV[4]) - tonumber(redis.call('GET', KEYS[1]) or '0') - tonumber(ARGV[1])
local asked = tonumber(ARGV[2])
local granted = asked
if asked < 0 or room < asked then
  granted = room
  if granted < tonumber(ARGV[3]) then return -1 end
end
if granted < 1 then return -1 end
redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]) + granted)
redis.call('EXPIRE', KEYS[1], ARGV[5], 'NX')
return granted
"""


def reserve_call_tokens(redis, key: str, input_bound: int, asked: int | None, least: int, cap: int) -> int | None:
    """Count one provider call's worst case into the day's tokens, its output lowered to the day's room, all in
    one step across the fleet. The output granted, or None when the day has no room for a useful call."""
    granted = _script(redis, _RESERVE_CALL_TOKENS)(
        keys=[key], args=[input_bound, -1 if asked is None else asked, least, cap, TTL_SECONDS[DAY]])
    return None if int(granted) < 0 else int(granted)


# --- dollars ----------------------------------------------------------------------------------------

# The dollar basis of a run (Run.dollar_basis).
METERED, FLOOR, REFUNDED, UNRESERVED = "metered", "floor", "refunded", "unreserved"
HOLD_TTL_SECONDS = TTL_SECONDS[MONTH]

# KEYS[1] the job's hold, KEYS[2..] the windows; ARGV amount, the hold's TTL, then each window's cap and TTL.
# Returns 0 when held everywhere, else the 1-based index of the first window without room (nothing held). A hold
# of the same job still open (one the budget rebuild wrote for an attempt in flight, or an earlier attempt's never
# settled) is charged whole first: a job never holds twice, and what it may have spent stays counted.
_RESERVE_USD = """
local prior = redis.call('HGET', KEYS[1], 'amount')
if prior then
  for key in string.gmatch(redis.call('HGET', KEYS[1], 'keys') or '', '%S+') do
    if redis.call('EXISTS', key) == 1 then
      redis.call('HINCRBY', key, 'held', -tonumber(prior))
      redis.call('HINCRBY', key, 'used', tonumber(prior))
    end
  end
  redis.call('DEL', KEYS[1])
end
local amount = tonumber(ARGV[1])
for i = 2, #KEYS do
  local counts = redis.call('HMGET', KEYS[i], 'used', 'held')
  local taken = tonumber(counts[1] or '0') + tonumber(counts[2] or '0')
  if taken + amount > tonumber(ARGV[1 + 2 * (i - 1)]) then return i - 1 end
end
local keys = {}
for i = 2, #KEYS do
  redis.call('HINCRBY', KEYS[i], 'held', amount)
  redis.call('EXPIRE', KEYS[i], ARGV[2 + 2 * (i - 1)], 'NX')
  keys[#keys + 1] = KEYS[i]
end
redis.call('HSET', KEYS[1], 'amount', amount, 'keys', table.concat(keys, ' '))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 0
"""
# KEYS[1] the job's hold; ARGV the charge in micro-dollars, negative for the whole hold. Returns the amount that
# was held, or -1 when there was no open hold (settled already, or expired): a hold is settled once, whoever
# tries again.
_SETTLE_USD = """
local amount = redis.call('HGET', KEYS[1], 'amount')
if not amount then return -1 end
amount = tonumber(amount)
local charge = tonumber(ARGV[1])
if charge < 0 then charge = amount end
for key in string.gmatch(redis.call('HGET', KEYS[1], 'keys') or '', '%S+') do
  if redis.call('EXISTS', key) == 1 then
    redis.call('HINCRBY', key, 'held', -amount)
    if charge > 0 then redis.call('HINCRBY', key, 'used', charge) end
  end
end
redis.call('DEL', KEYS[1])
return amount
"""


@cache
def _script(connection, source: str):
    """Sent once per connection, then run by its SHA (EVALSHA)."""
    return connection.register_script(source)


def usd_window_keys(ledger: str, now: datetime) -> dict[str, str]:
    return {name: key.replace(f"{PREFIX}:", f"{USD_PREFIX}:", 1) for name, key in window_keys(ledger, now).items()}


def hold_key(job_id: str) -> str:
    return f"{USD_PREFIX}:hold:{job_id}"


@dataclass(frozen=True)
class DollarWindow:
    """One dollar window in force now: its cap, what settled runs used, and what running jobs hold."""

    ledger: str  # `all`, or `s:<hash16>` of a scoped limit
    scope: str  # "" for the deployment; the scoped limit's scope
    window: str  # day | week | month
    key: str
    cap_micros: int
    used_micros: int = 0
    held_micros: int = 0

    @property
    def cap(self) -> Decimal:
        return money.to_usd(self.cap_micros)

    @property
    def used(self) -> Decimal:
        return money.to_usd(self.used_micros)

    @property
    def held(self) -> Decimal:
        return money.to_usd(self.held_micros)


def _usd_windows(ledger: str, scope: str, caps: dict[str, int | None], now: datetime) -> list[DollarWindow]:
    keys = usd_window_keys(ledger, now)
    return [DollarWindow(ledger, scope, name, keys[name], cap) for name, cap in caps.items() if cap]


def scoped_dollar_caps(limit) -> dict[str, int | None]:
    return {DAY: money.parse_usd(limit.day_usd), WEEK: money.parse_usd(limit.week_usd),
            MONTH: money.parse_usd(limit.month_usd)}


def applicable_dollar_windows(rows: MatchedRows, runtime, now: datetime) -> list[DollarWindow]:
    """The dollar windows a job's hold goes into: the matched scoped limit's, its project's, its models', then
    the deployment's."""
    windows, rows = [], MatchedRows.of(rows)
    for limit in (rows.scope, rows.project, *rows.models):
        if limit is not None:
            windows += _usd_windows(f"s:{scope_hash(limit.scope)}", limit.scope, scoped_dollar_caps(limit), now)
    windows += _usd_windows("all", "", {DAY: runtime.daily_cost_micros, WEEK: runtime.weekly_cost_micros,
                                        MONTH: runtime.monthly_cost_micros}, now)
    return windows


class DollarRefusal(Exception):
    def __init__(self, reason: str, window: DollarWindow | None = None):
        super().__init__(reason)
        self.reason = reason
        self.window = window


def job_cost_cap(spec: JobSpec, runtime) -> int | None:
    """The job's per-job cap in micro-dollars: the deployment's (settings row over environment), lowered by the
    trigger's run.maxCostUsd, never raised. Raises DollarRefusal(`job-payload-invalid`) for a payload whose
    amount this worker cannot read."""
    deployment = runtime.max_cost_micros
    try:
        trigger = money.parse_usd(spec.max_cost_usd)
    except money.MoneyError:
        raise DollarRefusal("job-payload-invalid") from None
    caps = [cap for cap in (deployment, trigger) if cap is not None]
    return min(caps) if caps else None


@dataclass
class DollarHold:
    """A job's dollar hold, from the reservation to its one settlement."""

    job_id: str
    cap_micros: int | None  # the per-job cap (the gateway's stop), None: no dollar cap at all
    keys: list[str] = field(default_factory=list)
    settled: bool = False
    basis: str = ""
    charged_micros: int | None = None

    @property
    def amount(self) -> int:
        return self.cap_micros if self.keys else 0

    def record_fields(self) -> dict:
        """The Run record's dollar fields for how this hold ended."""
        if self.cap_micros is None:
            return {}
        return {"dollars_reserved": money.to_usd(self.amount) if self.keys else None,
                "dollars_charged": money.to_usd(self.charged_micros), "dollar_basis": self.basis}


def reserve_dollars(redis, spec: JobSpec, rows: MatchedRows, runtime, now: datetime) -> DollarHold:
    """Hold the job's per-job cap in every dollar window that applies, all or none.

    Raises DollarRefusal(`dollar-cap` | `cost-cap-unset` | `job-payload-invalid`); nothing is held then.
    """
    cap = job_cost_cap(spec, runtime)
    windows = applicable_dollar_windows(rows, runtime, now)
    if windows and cap is None:
        # Only a scoped limit's dollar row gets here: the deployment's windows were refused without a cap.
        raise DollarRefusal("cost-cap-unset", windows[0])
    hold = DollarHold(spec.job_id, cap)
    if not windows:
        hold.basis = UNRESERVED if cap is not None else ""
        return hold
    args = [cap, HOLD_TTL_SECONDS]
    for window in windows:
        args += [window.cap_micros, TTL_SECONDS[window.window]]
    blocked = _script(redis, _RESERVE_USD)(keys=[hold_key(spec.job_id), *(w.key for w in windows)], args=args)
    if blocked:
        raise DollarRefusal("dollar-cap", windows[int(blocked) - 1])
    hold.keys = [window.key for window in windows]
    return hold


def settle_dollars(redis, hold: DollarHold, *, ran: bool, cost: Decimal | None) -> None:
    """Once per hold: refund it (no container ran), charge the metered cost (`cost`, None when it cannot be
    known), or keep the whole hold charged (`floor`). A Redis fault propagates with the hold still open."""
    if hold.settled:
        return
    if hold.cap_micros is None or not hold.keys:  # no dollar cap, or a per-job cap and no window to hold in
        hold.settled, hold.basis = True, (UNRESERVED if hold.cap_micros is not None else "")
        return
    if not ran:
        charge, basis = 0, REFUNDED
    elif cost is not None:
        charge, basis = money.cost_micros(cost), METERED
    else:
        charge, basis = hold.amount, FLOOR
    _script(redis, _SETTLE_USD)(keys=[hold_key(hold.job_id)], args=[charge])
    hold.settled, hold.basis, hold.charged_micros = True, basis, charge
    if charge > hold.amount:
        # The gateway stops a job once its cost reaches the cap, so the call that crossed it is charged too.
        logger.warning("dollar_cap_overshoot job=%s held_micros=%d charged_micros=%d", hold.job_id, hold.amount,
                       charge)


def keep_hold(hold: DollarHold) -> None:
    """The hold could not be settled (Redis did not answer): it stays whole until its keys expire."""
    hold.settled, hold.basis, hold.charged_micros = True, FLOOR, hold.amount


def charge_lost_hold(redis, job_id: str) -> int | None:
    """The open hold of an attempt whose worker died, charged whole as spent (`floor`: its container may have
    spent all of it), so that the job's next attempt holds its own. The amount, or None when none was open."""
    charged = _script(redis, _SETTLE_USD)(keys=[hold_key(job_id)], args=[-1])
    return None if charged < 0 else int(charged)


def dollar_windows_in_force(redis, now: datetime | None = None) -> list[DollarWindow]:
    """Every dollar window configured now (the deployment's, then each scoped limit's dollar fields), with its
    cap and the micro-dollars used and held in it. Caps come from the settings row over the environment; an
    unusable settings row (every job is refused then) shows the environment's."""
    from apps.worker.gates import runtime_settings
    from apps.worker.models import ScopedLimit

    now = now or timezone.now()
    try:
        runtime = runtime_settings.current()
    except runtime_settings.SettingsInvalid:
        runtime = runtime_settings.from_environment()
    windows = _usd_windows("all", "", {DAY: runtime.daily_cost_micros, WEEK: runtime.weekly_cost_micros,
                                       MONTH: runtime.monthly_cost_micros}, now)
    rows = ScopedLimit.objects.exclude(day_usd=None, week_usd=None, month_usd=None).order_by("scope")
    for row in rows:
        windows += _usd_windows(f"s:{scope_hash(row.scope)}", row.scope, scoped_dollar_caps(row), now)
    if not windows:
        return []
    with redis.pipeline(transaction=False) as pipe:
        for window in windows:
            pipe.hmget(window.key, "used", "held")
        answers = pipe.execute()
    return [DollarWindow(w.ledger, w.scope, w.window, w.key, w.cap_micros, int(used or 0), int(held or 0))
            for w, (used, held) in zip(windows, answers, strict=True)]


# --- scoped limits --------------------------------------------------------------------------------

def limit_for(spec: JobSpec):
    """The scoped limit that applies to a job: forge-qualified row first, then the bare repo row."""
    from apps.worker.models import ScopedLimit

    candidates = job_scopes(spec)
    rows = {row.scope: row for row in ScopedLimit.objects.filter(scope__in=candidates)}
    return next((rows[scope] for scope in candidates if scope in rows), None)


def rows_for(spec: JobSpec) -> MatchedRows:
    """Every scoped-limit row a job answers to, in one read: its own scope's, its project's (the project it was
    stamped with), and every model row (narrowed by MatchedRows.calling once the job's models are known)."""
    from apps.worker.models import ScopedLimit

    candidates = job_scopes(spec)
    project_scope = f"{PROJECT_PREFIX}{spec.project}" if spec.project else ""
    wanted = Q(scope__in=[*candidates, project_scope]) | Q(scope__startswith=MODEL_PREFIX)
    found = {row.scope: row for row in ScopedLimit.objects.filter(wanted).order_by("scope")}
    return MatchedRows(scope=next((found[name] for name in candidates if name in found), None),
                       project=found.get(project_scope),
                       models=tuple(row for name, row in found.items() if name.startswith(MODEL_PREFIX)))
