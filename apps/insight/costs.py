"""What the cost page shows, aggregated in the database: a window of UTC days, its totals, its days, and where
its dollars went (flow, trigger, model, repository/folder, host, outcome).

Every number comes from GROUP BYs over the window's rows (run_started_idx bounds each scan), summed from per-day
partials of which the closed days' are kept in Redis (below: a cache with exact invalidation, never the truth).
The model breakdown unrolls each run's usage ledger in SQL (json_each on SQLite, jsonb_array_elements on
PostgreSQL).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from urllib.parse import urlencode

from django.db import connection, transaction
from django.db.models import Case, Count, F, IntegerField, Q, Sum, Value, When
from django.db.models.functions import TruncDate
from django.urls import reverse
from django.utils import timezone
from redis.exceptions import RedisError

WINDOWS = {"7d": "7 days", "30d": "30 days", "mtd": "month to date"}
DEFAULT_WINDOW = "30d"
TOP = 8  # rows per breakdown before "+N more"

# The cost basis another change adds to Run (apps/worker migration 0007): these values are a floor or an estimate.


def estimated_expression():
    """1 for a run whose dollars are a floor or an estimate rather than metered, else 0: the one hook for the
    cost basis. A dollar-capped run says so itself (`dollar_basis`: `metered`, or `floor` when its cost could not
    be known and its whole hold was kept). Otherwise a run that used tokens and was not priced by its egress
    gateway (the runner's own claim, or an unpriced model) is an estimate; a run refused before it could spend
    (no tokens) is an exact $0."""
    # Case/When, not a negated Q: a missing JSON key compares as NULL, which a NOT would drop from both sides.
    return Case(When(dollar_basis="floor", then=Value(1)), When(dollar_basis="metered", then=Value(0)),
                When(Q(usage__source="gateway", cost__isnull=False), then=Value(0)),
                When(tokens_total__gt=0, then=Value(1)), default=Value(0), output_field=IntegerField())


@dataclass(frozen=True)
class Window:
    key: str
    label: str
    start: datetime
    end: datetime

    @property
    def days(self) -> list[date]:
        first, last = self.start.date(), self.end.date()
        return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def window(key: str, now: datetime | None = None) -> Window:
    """UTC calendar days up to now: the last 7 or 30 days (today included), or the month so far."""
    key = key if key in WINDOWS else DEFAULT_WINDOW
    now = (now or timezone.now()).astimezone(UTC)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    start = today.replace(day=1) if key == "mtd" else today - timedelta(days=int(key[:-1]) - 1)
    return Window(key, WINDOWS[key], start, now)


@dataclass
class Totals:
    runs: int = 0
    completed: int = 0
    spend: Decimal = Decimal(0)
    tokens: int = 0
    estimated: int = 0  # runs whose dollars are a floor or an estimate
    unknown: int = 0  # of those, runs that spent tokens no price list priced (Run.cost_unknown)

    @property
    def completed_share(self) -> float | None:
        return self.completed / self.runs if self.runs else None

    @property
    def per_completed(self) -> Decimal | None:
        """What one completed run costs, the failed and refused runs' dollars included."""
        return self.spend / self.completed if self.completed else None


@dataclass
class Day(Totals):
    day: date | None = None


@dataclass
class Row(Totals):
    label: str = ""
    link: str = ""


@dataclass
class Breakdown:
    name: str
    rows: list[Row]
    more: int = 0  # further rows past TOP
    more_spend: Decimal = Decimal(0)


@dataclass
class CostSummary:
    window: Window
    totals: Totals
    days: list[Day]
    breakdowns: list[Breakdown] = field(default_factory=list)


def _measures():
    return dict(runs=Count("id"), completed=Count("id", filter=Q(outcome="completed")), spend=Sum("cost"),
                tokens=Sum("tokens_total"), estimated=Sum(estimated_expression()))


def _fill(target: Totals, values: dict) -> Totals:
    target.runs = values.get("runs") or 0
    target.completed = values.get("completed") or 0
    target.spend = Decimal(str(values.get("spend") or 0)).quantize(Decimal("0.000001"))
    target.tokens = int(values.get("tokens") or 0)
    target.estimated = int(values.get("estimated") or 0)
    return target


def run_list_url(win: Window, **filters) -> str:
    """The admin's run list filtered to the window and one bucket: only parameters its list_filter and its
    field lookups accept (the date filter's own started_at__gte / __lt)."""
    params = {"started_at__gte": win.start.isoformat(), "started_at__lt": (win.end + timedelta(seconds=1)).isoformat()}
    params.update(filters)
    return f"{reverse('admin:worker_run_changelist')}?{urlencode(params)}"


def _span(start: datetime, end: datetime):
    """Runs started in [start, end): an index range of run_started_idx."""
    from apps.worker.models import Run

    return Run.objects.filter(started_at__gte=start, started_at__lt=end).order_by()


def _top(name: str, rows: list[Row]) -> Breakdown:
    rows.sort(key=lambda row: (-row.spend, -row.runs, row.label))
    rest = rows[TOP:]
    return Breakdown(name, rows[:TOP], more=len(rest), more_spend=sum((row.spend for row in rest), Decimal(0)))


# --- per-day partial aggregates ---------------------------------------------------------------------------
#
# The page sums per-day partials: for each UTC day, its runs grouped by each breakdown's columns (and by model).
# Closed days (before yesterday: a run's record is written when it ends, at most PI_JOB_TIMEOUT_SECONDS after its
# start) are kept in Redis, so a 30-day window over a long history reads one day and a bit from the database.
# Any run record written or deleted for a day moves that day's generation on (signals in apps.py, and for
# housekeeping's batches, which send no per-row signal, keep_pruned), from whichever process writes it, and a
# partial computed under an older generation is never read; a partial also expires after PARTIAL_TTL_SECONDS, so
# one that missed its drop (Redis down at that moment) is not kept for long. Without Redis every day is read from
# the database. /metrics' partials also count each day's pruned runs (PrunedRuns): they are the same before and
# after a prune, where the cost page's count only the runs still kept.

GROUPINGS = {"day": (), "flow": ("flow", "command"), "trigger": ("trigger_id", "trigger_type"),
             "scope": ("scope",), "project": ("project",), "host": ("host",), "outcome": ("outcome",)}
# /metrics keeps partials of its own, runs by outcome, reason and project over the whole history: one cheap
# grouping, so reading a year of days afresh costs one GROUP BY, not the page's eight.
KINDS = {"page": GROUPINGS, "reasons": {"reason": ("reason", "outcome", "project")}}
MEASURES = ("runs", "completed", "spend", "tokens", "estimated")
PARTIAL_PREFIX = "pidispatch:insight:day:v3:"  # v3: partials carry the project
PARTIAL_TTL_SECONDS = 24 * 3600


def _row(values: dict, columns) -> dict:
    row = {column: values[column] for column in columns}
    row.update(runs=values["runs"] or 0, completed=values["completed"] or 0, tokens=int(values["tokens"] or 0),
               estimated=int(values["estimated"] or 0),
               spend=str(Decimal(str(values["spend"] or 0)).quantize(Decimal("0.000001"))))
    return row


def _partials_separately(start: datetime, end: datetime, groupings: dict) -> dict[date, dict]:
    runs = _span(start, end).annotate(day=TruncDate("started_at", tzinfo=UTC))
    partials: dict[date, dict] = {}
    for name, columns in groupings.items():
        for values in runs.values("day", *columns).annotate(**_measures()):
            partials.setdefault(values["day"], {}).setdefault(name, []).append(_row(values, columns))
    return partials


def _partials_in_one_pass(start: datetime, end: datetime, groupings: dict) -> dict[date, dict]:
    """PostgreSQL: one scan of the span's rows feeds every grouping (GROUPING SETS). The rows are the ORM's own
    query (the estimate flag included), so the SQL here adds only the grouping."""
    columns = list(dict.fromkeys(column for fields in groupings.values() for column in fields))
    rows = (_span(start, end).annotate(day=TruncDate("started_at", tzinfo=UTC), est=estimated_expression())
            .values("day", *columns, "cost", "tokens_total", "est"))
    rows_sql, params = rows.query.sql_with_params()
    quote = connection.ops.quote_name
    sets = ", ".join("(" + ", ".join(quote(column) for column in ("day", *fields)) + ")"
                     for fields in groupings.values())
    flags = ", ".join(f"GROUPING(r.{quote(column)})" for column in columns)
    sql = (f"SELECT {flags}, r.day, {', '.join(f'r.{quote(column)}' for column in columns)}, COUNT(*), "
           f"COUNT(*) FILTER (WHERE r.outcome = 'completed'), SUM(r.cost), SUM(r.tokens_total), SUM(r.est) "
           f"FROM ({rows_sql}) r GROUP BY GROUPING SETS ({sets})")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    by_columns = {frozenset(fields): name for name, fields in groupings.items()}
    partials: dict[date, dict] = {}
    for record in found:
        # GROUPING(x) is 0 for the columns the row is grouped by, which name its set.
        name = by_columns[frozenset(column for column, flag in zip(columns, record[:len(columns)], strict=True)
                                    if flag == 0)]
        values = dict(zip(("day", *columns, *MEASURES), record[len(columns):], strict=True))
        partials.setdefault(values["day"], {}).setdefault(name, []).append(_row(values, groupings[name]))
    return partials


def _reason_partials(start: datetime, end: datetime) -> dict[date, dict]:
    """/metrics' partials: the span's runs by reason and outcome, and the runs of its days that housekeeping pruned
    (PrunedRuns), read in one statement (UNION ALL), so no prune committing in between can count a run twice or
    not at all: a day's partial is the same before, during and after its runs are pruned."""
    from .models import PrunedRuns

    columns = KINDS["reasons"]["reason"]
    kept = (_span(start, end).annotate(day=TruncDate("started_at", tzinfo=UTC)).values("day", *columns)
            .annotate(**_measures()))
    last_day = (end - timedelta(microseconds=1)).astimezone(UTC).date()
    pruned = (PrunedRuns.objects.filter(day__gte=start.astimezone(UTC).date(), day__lte=last_day)
              .annotate(d=F("day")).values("d", *columns)
              .annotate(r=Sum("runs"), c=Sum("completed"), s=Sum("spend"), t=Sum("tokens"), e=Sum("estimated")))
    summed: dict[tuple, dict] = {}
    for values in kept.union(pruned, all=True):
        into = summed.setdefault((values["day"], *(values[column] for column in columns)), dict.fromkeys(MEASURES, 0))
        for measure in MEASURES:
            into[measure] += values[measure] or 0
    partials: dict[date, dict] = {}
    for (day, *key), measures in summed.items():
        row = _row({**dict(zip(columns, key, strict=True)), **measures}, columns)
        partials.setdefault(day, {}).setdefault("reason", []).append(row)
    return partials


def _partials(start: datetime, end: datetime, kind: str = "page") -> dict[date, dict]:
    groupings = KINDS[kind]
    with_models = kind == "page"
    if connection.vendor != "postgresql":
        partials = _reason_partials(start, end) if kind == "reasons" else _partials_separately(start, end, groupings)
        model = _model_partials(start, end) if with_models else {}
    else:
        with transaction.atomic():
            with connection.cursor() as cursor:
                # The planner guesses 100 ledger rows per run, so a short span looks costly enough to JIT-compile:
                # 150 ms of compiling for a 10 ms query.
                cursor.execute("SET LOCAL jit = off")
            partials = (_reason_partials(start, end) if kind == "reasons"
                        else _partials_in_one_pass(start, end, groupings))
            model = _model_partials(start, end) if with_models else {}
    for day, names in model.items():
        partials.setdefault(day, {})["model"] = names
    return partials


def _redis():
    from apps.fleet.connection import get_redis

    return get_redis()


def partial_key(day: date, kind: str = "page") -> str:
    return f"{PARTIAL_PREFIX}{kind}:{day.isoformat()}"


def generation_key(day: date) -> str:
    return f"{PARTIAL_PREFIX}gen:{day.isoformat()}"


GENERATION_TTL_SECONDS = 40 * 86400  # longer than any window reaches back


def _read_partials(days: list[date], kind: str) -> tuple[dict[date, dict], dict[date, int]]:
    """The kept partials still true (their day's generation unchanged since they were computed), and every
    day's generation now, for the partials computed next."""
    if not days:
        return {}, {}
    try:
        found = _redis().mget([partial_key(day, kind) for day in days] + [generation_key(day) for day in days])
    except (RedisError, OSError):
        return {}, {}
    generations = {day: int(value or 0) for day, value in zip(days, found[len(days):], strict=True)}
    partials = {}
    for day, value in zip(days, found[:len(days)], strict=True):
        partial = json.loads(value) if value else None
        if partial and partial.get("generation") == generations[day]:
            partials[day] = partial
    return partials, generations


def _write_partials(partials: dict[date, dict], generations: dict[date, int], kind: str) -> None:
    if not partials or not generations:
        return
    try:
        with _redis().pipeline(transaction=False) as pipe:
            for day, partial in partials.items():
                # A record written while this was computed moved the generation on: this partial is then
                # never read (a plain delete could land before this write and be lost).
                pipe.set(partial_key(day, kind), json.dumps({**partial, "generation": generations[day]}, default=str),
                         ex=PARTIAL_TTL_SECONDS)
            pipe.execute()
    except (RedisError, OSError):
        pass  # the next view reads those days from the database again


def _quick_redis():
    """For the drop on the run record's write path: a worker settling a run while Redis is down must not wait
    the shared pool's connect timeout, nor a failover (the drop is best-effort, bounded by PARTIAL_TTL_SECONDS)."""
    from apps.fleet.connection import redis_client

    return redis_client(0.3, 0.5, waits=False)


def forget_day(moment: datetime) -> None:
    """A run record for that day was written or deleted: its kept partial is no longer the truth."""

    day = moment.astimezone(UTC).date()
    try:
        with _quick_redis().pipeline(transaction=True) as pipe:
            pipe.incr(generation_key(day))
            pipe.expire(generation_key(day), GENERATION_TTL_SECONDS)
            pipe.delete(*(partial_key(day, kind) for kind in KINDS))
            pipe.execute()
    except (RedisError, OSError):
        pass  # bounded by PARTIAL_TTL_SECONDS


def keep_pruned(sender, runs, **kwargs) -> None:
    """`apps.worker.housekeeping.runs_pruning` receiver, inside the transaction that deletes the batch `runs` (a
    queryset): their counts go to PrunedRuns, so /metrics' counters keep them, and once the delete is committed
    their days' kept partials are dropped, so the cost page no longer counts them (a bulk delete sends no per-row
    signal)."""
    from .models import PrunedRuns

    groups = list(runs.order_by().annotate(day=TruncDate("started_at", tzinfo=UTC))
                  .values("day", "outcome", "reason", "project").annotate(**_measures()))
    PrunedRuns.objects.bulk_create(
        PrunedRuns(day=group["day"], outcome=group["outcome"], reason=group["reason"], project=group["project"],
                   runs=group["runs"],
                   completed=group["completed"], spend=group["spend"] or 0, tokens=group["tokens"] or 0,
                   estimated=group["estimated"] or 0) for group in groups)
    days = sorted({group["day"] for group in groups})
    transaction.on_commit(lambda: [forget_day(_midnight(day)) for day in days])


def first_day() -> date | None:
    """The first UTC day /metrics counts runs of: its oldest kept run's (run_started_idx), or a pruned one's."""
    from apps.worker.models import Run

    from .models import PrunedRuns

    first = Run.objects.order_by("started_at").values_list("started_at", flat=True).first()
    pruned = PrunedRuns.objects.order_by("day").values_list("day", flat=True).first()
    days = [day for day in (first and first.astimezone(UTC).date(), pruned) if day]
    return min(days) if days else None


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _stretches(days: list[date]) -> list[tuple[date, date]]:
    """Consecutive days as (first, last) pairs: each is one index range to read."""
    stretches: list[list[date]] = []
    for day in sorted(days):
        if stretches and (day - stretches[-1][1]).days == 1:
            stretches[-1][1] = day
        else:
            stretches.append([day, day])
    return [(first, last) for first, last in stretches]


def day_partials(days: list[date], end: datetime, kind: str = "page") -> dict[date, dict]:
    """Each day's partial aggregates up to `end` (now): kept ones for closed days, the rest from the database."""
    closed_before = end.date() - timedelta(days=1)  # yesterday may still gain records of runs ending now
    closed = [day for day in days if day < closed_before]
    open_days = [day for day in days if day >= closed_before]
    partials, generations = _read_partials(closed, kind)
    fresh: dict[date, dict] = {}
    for first, last in _stretches([day for day in closed if day not in partials]):
        computed = _partials(_midnight(first), _midnight(last + timedelta(days=1)), kind)
        fresh.update({first + timedelta(days=n): computed.get(first + timedelta(days=n), {})
                      for n in range((last - first).days + 1)})
    _write_partials(fresh, generations, kind)
    partials.update(fresh)
    if open_days:
        computed = _partials(_midnight(open_days[0]), end + timedelta(microseconds=1), kind)
        partials.update({day: computed.get(day, {}) for day in open_days})
    return partials


def _window_partials(win: Window) -> dict[date, dict]:
    return day_partials(win.days, win.end)


def merged(partials: dict[date, dict], name: str) -> list[dict]:
    """One grouping's rows summed over the days."""
    columns = next((groupings[name] for groupings in KINDS.values() if name in groupings), ("name",))
    return _merged(partials, name, columns)


def _merged(partials: dict[date, dict], name: str, columns) -> list[dict]:
    merged: dict[tuple, dict] = {}
    for partial in partials.values():
        for row in partial.get(name, ()):
            key = tuple(row[column] for column in columns)
            into = merged.setdefault(key, {**{column: row[column] for column in columns}, "runs": 0, "completed": 0,
                                           "spend": Decimal(0), "tokens": 0, "estimated": 0})
            for measure in MEASURES:
                into[measure] += Decimal(row[measure]) if measure == "spend" else row[measure]
    return list(merged.values())


def _by_flow(win: Window, grouped) -> Breakdown:
    rows = []
    for values in grouped:
        flow, command = values["flow"], values["command"]
        label = flow or (f"/{command}" if command else "(no flow)")
        link = run_list_url(win, flow__exact=flow, **({} if flow else {"command__exact": command}))
        rows.append(_fill(Row(label=label, link=link), values))
    return _top("flow", rows)


def _by_trigger(win: Window, grouped) -> Breakdown:
    from apps.receiver.models import Trigger

    names = {t.pk: str(t) for t in Trigger.objects.filter(pk__in={v["trigger_id"] for v in grouped if v["trigger_id"]})}
    rows = []
    for values in grouped:
        trigger_id, kind = values["trigger_id"], values["trigger_type"]
        if trigger_id:
            label, link = names.get(trigger_id, f"#{trigger_id}"), run_list_url(win, trigger__id__exact=trigger_id)
        else:
            label = {"manual": "(manual)", "": "(no trigger)"}.get(kind, f"({kind}, trigger deleted)")
            link = run_list_url(win, trigger__isnull="True", trigger_type=kind) if kind else \
                run_list_url(win, trigger__isnull="True", trigger_type__exact="")
        rows.append(_fill(Row(label=label, link=link), values))
    return _top("trigger", rows)


def _by_field(win: Window, grouped, name: str, column: str, empty: str, param: str) -> Breakdown:
    rows = []
    for values in grouped:
        value = values[column]
        rows.append(_fill(Row(label=value or empty, link=run_list_url(win, **{param: value})), values))
    return _top(name, rows)


MODEL_SQL = {
    # One row per (run, model row of its ledger) over the span's runs, which the ORM selects (with the estimate
    # flag of estimated_expression, so the hook stays one function). A ledger names each model once, so a plain
    # count is a count of runs (no DISTINCT, whose sorts cost more than the rest of the page).
    "sqlite": """
        SELECT r.day, json_extract(m.value, '$.provider') || '/' || json_extract(m.value, '$.model') AS name,
               COUNT(*), SUM(CASE WHEN r.outcome = 'completed' THEN 1 ELSE 0 END),
               SUM(CAST(json_extract(m.value, '$.cost') AS REAL)),
               SUM(COALESCE(json_extract(m.value, '$.input'), 0) + COALESCE(json_extract(m.value, '$.output'), 0)
                   + COALESCE(json_extract(m.value, '$.cacheRead'), 0)
                   + COALESCE(json_extract(m.value, '$.cacheWrite'), 0)),
               SUM(r.est)
        FROM ({runs}) r, json_each(r.usage, '$.models') m
        GROUP BY r.day, name""",
    "postgresql": """
        SELECT r.day, (m.value->>'provider') || '/' || (m.value->>'model') AS name,
               COUNT(*), COUNT(*) FILTER (WHERE r.outcome = 'completed'), SUM((m.value->>'cost')::numeric),
               SUM(COALESCE((m.value->>'input')::bigint, 0) + COALESCE((m.value->>'output')::bigint, 0)
                   + COALESCE((m.value->>'cacheRead')::bigint, 0) + COALESCE((m.value->>'cacheWrite')::bigint, 0)),
               COUNT(*) FILTER (WHERE r.est = 1)
        FROM ({runs}) r CROSS JOIN LATERAL jsonb_array_elements(
            CASE WHEN jsonb_typeof(r.usage->'models') = 'array' THEN r.usage->'models' ELSE '[]'::jsonb END) m
        GROUP BY r.day, name""",
}


def _model_partials(start: datetime, end: datetime) -> dict[date, list[dict]]:
    sql = MODEL_SQL.get(connection.vendor)
    if sql is None:
        return {}
    runs = (_span(start, end).filter(usage__models__isnull=False)
            .annotate(day=TruncDate("started_at", tzinfo=UTC), est=estimated_expression())
            .values("id", "day", "outcome", "usage", "est"))
    runs_sql, params = runs.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql.format(runs=runs_sql), params)
        found = cursor.fetchall()
    partials: dict[date, list[dict]] = {}
    for day, *values in found:
        if isinstance(day, str):  # SQLite's date function answers text
            day = date.fromisoformat(day)
        partials.setdefault(day, []).append(_row(dict(zip(("name", *MEASURES[:2], "spend", "tokens", "estimated"),
                                                           values, strict=True)), ("name",)))
    return partials


def _by_model(win: Window, grouped) -> Breakdown:
    rows = []
    for values in grouped:
        name = values["name"]
        model = name.split("/", 1)[1] if name and "/" in name else name
        # The ledger's model names are the record's own; the run list finds them in its usage.
        rows.append(_fill(Row(label=name or "(unknown)",
                              link=run_list_url(win, usage__icontains=f'"model": "{model}"')), values))
    return _top("model", rows)


def summary(key: str = DEFAULT_WINDOW, now: datetime | None = None) -> CostSummary:
    win = window(key, now)
    partials = _window_partials(win)
    days = [_fill(Day(day=day), (_merged({day: partials.get(day, {})}, "day", ()) or [{}])[0]) for day in win.days]
    totals = Totals()
    for day in days:
        totals.runs += day.runs
        totals.completed += day.completed
        totals.spend += day.spend
        totals.tokens += day.tokens
        totals.estimated += day.estimated
    totals.unknown = _span(win.start, win.end).filter(cost__isnull=True, tokens_total__gt=0).count()
    grouped = {name: _merged(partials, name, columns) for name, columns in GROUPINGS.items()}
    breakdowns = [
        _by_flow(win, grouped["flow"]), _by_trigger(win, grouped["trigger"]),
        _by_model(win, _merged(partials, "model", ("name",))),
        _by_field(win, grouped["scope"], "repository / folder", "scope", "(no scope)", "scope__exact"),
        _by_field(win, grouped["project"], "project", "project", "(no project)", "project__exact"),
        _by_field(win, grouped["host"], "host", "host", "(no host)", "host__exact"),
        _by_field(win, grouped["outcome"], "outcome", "outcome", "(none)", "outcome__exact"),
    ]
    return CostSummary(win, totals, days, breakdowns)
