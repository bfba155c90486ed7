"""What the admin fleet panel shows: the fleet snapshot (Redis) beside the day's spend.

Display code, so it may read the worker's counters and models (DESIGN section 1): the job-count counters
the caps are checked against (UTC day, Monday week, month; refused reservations count), today's tokens,
and today's cost from the run history.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError
from django.db.models import Sum
from django.utils import timezone
from redis.exceptions import RedisError

from . import status


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


def windows(now: datetime) -> dict[str, datetime]:
    """UTC calendar windows; weeks start on Monday."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return {"day": day, "week": day - timedelta(days=day.weekday()), "month": day.replace(day=1)}


def spend(redis, now: datetime | None = None) -> Spend:
    """The counters the caps are checked against (Redis: reservations, refusals included) and today's cost."""
    from apps.worker import budget
    from apps.worker.limits import deployment_caps
    from apps.worker.models import Run

    now = now or timezone.now()
    starts = windows(now)
    totals = {**budget.deployment_counts(redis, now), "tokens": budget.tokens_spent_today(redis, now)}
    totals["cost"] = Run.objects.filter(started_at__gte=starts["day"]).aggregate(cost=Sum("cost"))["cost"]
    try:
        caps = deployment_caps()
        cap_of, token_cap, caps_error = {"day": caps.day, "week": caps.week, "month": caps.month}, caps.daily_tokens, ""
    except Exception as exc:  # an invalid settings overlay refuses every job; say so rather than guess caps
        cap_of, token_cap, caps_error = {}, None, f"caps unknown: {exc}"
    return Spend(
        meters=tuple(Meter(name, totals[name], cap_of.get(name)) for name in starts),
        tokens_today=totals["tokens"] or 0, token_cap=token_cap, cost_today=totals["cost"] or 0,
        caps_error=caps_error,
    )


def failure_reasons(job_ids) -> dict[str, str]:
    """The latest run record's outcome/reason of each failed job."""
    from apps.worker.models import Run

    reasons = {}
    for job_id, outcome, reason in (Run.objects.filter(job_id__in=list(job_ids))
                                    .order_by("job_id", "attempt").values_list("job_id", "outcome", "reason")):
        reasons[job_id] = f"{outcome} {reason}".strip()
    return reasons


RECENT_PUBLICATIONS = 8


def recent_publications():
    """The latest runs whose work reached the forge as a pull/merge request, newest first (their links)."""
    from apps.worker.models import Run

    return list(Run.objects.filter(publish_outcome="published").exclude(publish_url="").order_by("-started_at")
                .values("job_id", "kind", "target", "publish_outcome", "pull_request", "publish_url", "ended_at")
                [:RECENT_PUBLICATIONS])  # run_published_idx: a long history costs no scan


def explanations(reasons: dict[str, str]) -> dict[str, str]:
    """Each failed job's reason in words (the reason table), for the panel's hover."""
    from apps.worker.reasons import explain

    found = {}
    for job_id, text in reasons.items():
        reason = explain(text.partition(" ")[2])
        if reason:
            found[job_id] = f"{reason.means} Next: {reason.next_step}"
    return found


def context(redis) -> dict:
    data: dict = {"snapshot": None, "spend": None, "redis_error": "", "db_error": "", "reasons": {},
                  "explained": {}, "publications": []}
    try:
        data["snapshot"] = status.snapshot(redis)
    except RedisError as exc:
        data["redis_error"] = f"Redis unreachable ({type(exc).__name__}): the fleet cannot be shown or steered"
    try:
        data["spend"] = spend(redis)
        if data["snapshot"]:
            data["reasons"] = failure_reasons(f.job_id for f in data["snapshot"].failed)
            data["explained"] = explanations(data["reasons"])
        data["publications"] = recent_publications()
    except (DatabaseError, RedisError) as exc:
        data["db_error"] = f"spend and run history unreadable ({type(exc).__name__})"
    return data
