"""What has been spent against the caps in force: one computation for the fleet panel, the API's spend endpoint,
the cost page and /metrics.

The job-count counters the caps are checked against (UTC day, Monday week, month; refused reservations count),
today's tokens (the gateway's counter), today's cost from the run history, and, once the dollar caps exist
(`budget.dollar_windows_in_force`), the dollar windows as spent and held.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.utils import timezone


@dataclass(frozen=True)
class Meter:
    window: str
    used: int
    cap: int | None

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.used / self.cap)) if self.cap else 0

    @property
    def state(self) -> str:
        return "off" if not self.cap else "over" if self.used >= self.cap else "ok"


@dataclass(frozen=True)
class Spend:
    meters: tuple[Meter, ...]
    tokens_today: int
    token_cap: int | None
    cost_today: object
    caps_error: str = ""
    soft_hold_pct: int | None = None


def windows(now: datetime) -> dict[str, datetime]:
    """UTC calendar windows; weeks start on Monday."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return {"day": day, "week": day - timedelta(days=day.weekday()), "month": day.replace(day=1)}


def spend(redis, now: datetime | None = None) -> Spend:
    """The counters the caps are checked against (Redis: reservations, refusals included) and today's cost."""
    from apps.worker.gates import budget
    from apps.worker.gates.deployment_caps import deployment_caps
    from apps.worker.models import Run

    now = now or timezone.now()
    starts = windows(now)
    totals = {**budget.deployment_counts(redis, now), "tokens": budget.tokens_spent_today(redis, now)}
    totals["cost"] = Run.objects.cost_since(starts["day"])
    try:
        caps = deployment_caps()
        cap_of, token_cap, caps_error = {"day": caps.day, "week": caps.week, "month": caps.month}, caps.daily_tokens, ""
        soft_hold_pct = caps.soft_hold_pct
    except Exception as exc:  # an invalid settings overlay refuses every job; say so rather than guess caps
        cap_of, token_cap, caps_error, soft_hold_pct = {}, None, f"caps unknown: {exc}", None
    return Spend(
        meters=tuple(Meter(name, totals[name], cap_of.get(name)) for name in starts),
        tokens_today=totals["tokens"] or 0, token_cap=token_cap, cost_today=totals["cost"] or 0,
        caps_error=caps_error, soft_hold_pct=soft_hold_pct,
    )


# --- the budget in force, every window on one footing ------------------------------------------------------

OK, SOFT_HOLD, OVER, OFF = "ok", "soft hold", "over", "off"


@dataclass(frozen=True)
class BudgetLine:
    """One window of one ledger: `used` spent (or reserved), `held` reserved and not yet settled (dollars),
    over `cap`. The state is what the next job meets: `over` and `soft hold` refuse or hold it."""

    ledger: str  # "jobs", "tokens", "dollars"
    window: str  # "day", "week", "month"
    used: int | Decimal
    cap: int | Decimal | None
    held: int | Decimal = 0
    soft_hold_pct: int | None = None
    given_state: str = ""  # a ledger that knows its own state better (the dollar caps) says it
    scope: str = ""  # a scoped limit's repository or folder; "" for the deployment's own windows

    @property
    def committed(self):
        return self.used + self.held

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.committed / self.cap)) if self.cap else 0

    @property
    def state(self) -> str:
        if self.given_state:
            return self.given_state
        if not self.cap:
            return OFF
        if self.committed >= self.cap:
            return OVER
        # The job-count reservation refuses `soft-hold` once its count would pass cap * pct // 100.
        if self.soft_hold_pct and self.ledger == "jobs" and self.committed >= self.cap * self.soft_hold_pct // 100:
            return SOFT_HOLD
        return OK


@dataclass(frozen=True)
class Budget:
    lines: tuple[BudgetLine, ...]
    caps_error: str = ""


def _dollar_lines(redis, now: datetime) -> list[BudgetLine]:
    """Each dollar window in force (the deployment's and each scoped limit's), as used and held over its cap."""
    from apps.worker.gates import budget

    return [BudgetLine("dollars", window.window, window.used, window.cap, held=window.held, scope=window.scope)
            for window in budget.dollar_windows_in_force(redis, now)]


def _scoped_lines(redis, now: datetime) -> list[BudgetLine]:
    """Each scoped limit's capped windows, from the counters its reservations increment (no soft hold there: a
    scope past its cap refuses `scope-cap`)."""
    from apps.worker.gates import budget
    from apps.worker.gates.scopes import scope_hash
    from apps.worker.models import ScopedLimit

    wanted = []
    for limit in ScopedLimit.objects.order_by("scope"):
        keys = budget.window_keys(f"s:{scope_hash(limit.scope)}", now)
        wanted += [(limit.scope, name, keys[name], cap) for name, cap in
                   ((budget.DAY, limit.day), (budget.WEEK, limit.week), (budget.MONTH, limit.month)) if cap]
    if not wanted:
        return []
    values = redis.mget([key for _, _, key, _ in wanted])
    return [BudgetLine("jobs", name, int(value or 0), cap, scope=scope)
            for (scope, name, _, cap), value in zip(wanted, values, strict=True)]


def budget_in_force(redis, now: datetime | None = None) -> Budget:
    """Every window with a cap or a counter: the deployment's job counts (day, week, month), tokens (day), the
    dollar windows, then each scoped limit's capped windows."""
    now = now or timezone.now()
    current = spend(redis, now)
    lines = [BudgetLine("jobs", meter.window, meter.used, meter.cap, soft_hold_pct=current.soft_hold_pct)
             for meter in current.meters]
    lines.append(BudgetLine("tokens", "day", current.tokens_today, current.token_cap))
    return Budget(tuple(lines + _dollar_lines(redis, now) + _scoped_lines(redis, now)), caps_error=current.caps_error)
