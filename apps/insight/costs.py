"""What the cost page shows, aggregated in the database: a window of UTC days, its totals, its days, and where
its dollars went (flow, trigger, model, repository/folder, host, outcome).

Every number comes from a GROUP BY over the window's rows (run_started_idx bounds the scan); nothing is
stored beside the run history. The model breakdown unrolls each run's usage ledger in SQL (json_each on
SQLite, jsonb_array_elements on PostgreSQL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from urllib.parse import urlencode

from django.db import connection
from django.db.models import Case, Count, IntegerField, Max, Q, Sum, Value, When
from django.db.models.functions import TruncDate
from django.urls import reverse
from django.utils import timezone

WINDOWS = {"7d": "7 days", "30d": "30 days", "mtd": "month to date"}
DEFAULT_WINDOW = "30d"
TOP = 8  # rows per breakdown before "+N more"

# The cost basis another change adds to Run (apps/worker migration 0007): these values are a floor or an estimate.
ESTIMATED_BASES = ("floor", "estimate", "estimated")


def estimated_expression():
    """1 for a run whose dollars are a floor or an estimate rather than metered, else 0: the one hook for the
    cost basis. With Run.cost_basis, that field decides; until it lands, a run that used tokens and was not
    priced by its egress gateway (the runner's own claim, or an unpriced model) is an estimate. Runs refused
    before they could spend (no tokens) are an exact $0."""
    from apps.worker.models import Run

    if any(f.name == "cost_basis" for f in Run._meta.get_fields()):
        return Case(When(cost_basis__in=ESTIMATED_BASES, then=Value(1)), default=Value(0), output_field=IntegerField())
    # Case/When, not a negated Q: a missing JSON key compares as NULL, which a NOT would drop from both sides.
    return Case(When(Q(usage__source="gateway", cost__isnull=False), then=Value(0)),
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


def _runs(win: Window):
    from apps.worker.models import Run

    return Run.objects.filter(started_at__gte=win.start, started_at__lte=win.end).order_by()


def _top(name: str, rows: list[Row]) -> Breakdown:
    rows.sort(key=lambda row: (-row.spend, -row.runs, row.label))
    rest = rows[TOP:]
    return Breakdown(name, rows[:TOP], more=len(rest), more_spend=sum((row.spend for row in rest), Decimal(0)))


# The groupings the page shows; PostgreSQL computes them all in one pass over the window (GROUPING SETS),
# other databases with one GROUP BY each.
GROUPINGS = {"day": ("day",), "flow": ("flow", "command"), "trigger": ("trigger_id", "trigger_type"),
             "scope": ("scope",), "host": ("host",), "outcome": ("outcome",)}


def _grouped_separately(win: Window) -> dict[str, list[dict]]:
    runs = _runs(win).annotate(day=TruncDate("started_at", tzinfo=UTC))
    return {name: list(runs.values(*fields).annotate(**_measures())) for name, fields in GROUPINGS.items()}


def _grouped_in_one_pass(win: Window) -> dict[str, list[dict]]:
    """PostgreSQL: one scan of the window's rows (run_started_idx) feeds every grouping. The rows are the
    ORM's own query (the estimate flag included), so the SQL here adds only the grouping."""
    columns = [column for fields in GROUPINGS.values() for column in fields]
    rows = (_runs(win).annotate(day=TruncDate("started_at", tzinfo=UTC), est=estimated_expression())
            .values(*columns, "cost", "tokens_total", "est"))
    rows_sql, params = rows.query.sql_with_params()
    quote = connection.ops.quote_name
    sets = ", ".join("(" + ", ".join(quote(column) for column in fields) + ")" for fields in GROUPINGS.values())
    flags = ", ".join(f"GROUPING({quote(fields[0])})" for fields in GROUPINGS.values())
    sql = (f"SELECT {flags}, {', '.join(f'r.{quote(column)}' for column in columns)}, COUNT(*), "
           f"COUNT(*) FILTER (WHERE r.outcome = 'completed'), SUM(r.cost), SUM(r.tokens_total), SUM(r.est) "
           f"FROM ({rows_sql}) r GROUP BY GROUPING SETS ({sets})")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    grouped: dict[str, list[dict]] = {name: [] for name in GROUPINGS}
    names, width = list(GROUPINGS), len(GROUPINGS)
    for record in found:
        # GROUPING(x) is 0 for the columns the row is grouped by: exactly one set per row.
        name = names[[flag for flag in record[:width]].index(0)]
        values = dict(zip(columns, record[width:width + len(columns)]))
        runs, completed, spend, tokens, estimated = record[width + len(columns):]
        grouped[name].append({**{column: values[column] for column in GROUPINGS[name]}, "runs": runs,
                              "completed": completed, "spend": spend, "tokens": tokens, "estimated": estimated})
    return grouped


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
    # One row per (run, model row of its ledger) over the window's runs, which the ORM selects (with the estimate
    # flag of estimated_expression, so the hook stays one function). A ledger names each model once, so a plain
    # count is a count of runs (no DISTINCT, whose sorts cost more than the rest of the page).
    "sqlite": """
        SELECT json_extract(m.value, '$.provider') || '/' || json_extract(m.value, '$.model') AS name,
               COUNT(*), SUM(CAST(json_extract(m.value, '$.cost') AS REAL)),
               SUM(COALESCE(json_extract(m.value, '$.input'), 0) + COALESCE(json_extract(m.value, '$.output'), 0)
                   + COALESCE(json_extract(m.value, '$.cacheRead'), 0) + COALESCE(json_extract(m.value, '$.cacheWrite'), 0)),
               SUM(CASE WHEN r.outcome = 'completed' THEN 1 ELSE 0 END), SUM(r.est)
        FROM ({runs}) r, json_each(r.usage, '$.models') m
        GROUP BY name""",
    "postgresql": """
        SELECT (m.value->>'provider') || '/' || (m.value->>'model') AS name,
               COUNT(*), SUM((m.value->>'cost')::numeric),
               SUM(COALESCE((m.value->>'input')::bigint, 0) + COALESCE((m.value->>'output')::bigint, 0)
                   + COALESCE((m.value->>'cacheRead')::bigint, 0) + COALESCE((m.value->>'cacheWrite')::bigint, 0)),
               COUNT(*) FILTER (WHERE r.outcome = 'completed'), COUNT(*) FILTER (WHERE r.est = 1)
        FROM ({runs}) r CROSS JOIN LATERAL jsonb_array_elements(
            CASE WHEN jsonb_typeof(r.usage->'models') = 'array' THEN r.usage->'models' ELSE '[]'::jsonb END) m
        GROUP BY name""",
}


def _by_model(win: Window) -> Breakdown:
    sql = MODEL_SQL.get(connection.vendor)
    if sql is None:
        return Breakdown("model", [])
    runs = (_runs(win).filter(usage__models__isnull=False).annotate(est=estimated_expression())
            .values("id", "outcome", "usage", "est"))
    runs_sql, params = runs.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql.format(runs=runs_sql), params)
        found = cursor.fetchall()
    rows = []
    for name, runs, spend, tokens, completed, estimated in found:
        model = name.split("/", 1)[1] if name and "/" in name else name
        rows.append(Row(label=name or "(unknown)", runs=runs, completed=completed, estimated=estimated,
                        spend=Decimal(str(spend or 0)).quantize(Decimal("0.000001")), tokens=int(tokens or 0),
                        # The ledger's model names are the record's own; the run list finds them in its usage.
                        link=run_list_url(win, usage__icontains=f'"model": "{model}"')))
    return _top("model", rows)


def summary(key: str = DEFAULT_WINDOW, now: datetime | None = None) -> CostSummary:
    win = window(key, now)
    grouped = (_grouped_in_one_pass if connection.vendor == "postgresql" else _grouped_separately)(win)
    by_day = {values["day"]: values for values in grouped["day"]}
    days = [_fill(Day(day=day), by_day.get(day, {})) for day in win.days]
    totals = Totals()
    for day in days:
        totals.runs += day.runs
        totals.completed += day.completed
        totals.spend += day.spend
        totals.tokens += day.tokens
        totals.estimated += day.estimated
    breakdowns = [
        _by_flow(win, grouped["flow"]), _by_trigger(win, grouped["trigger"]), _by_model(win),
        _by_field(win, grouped["scope"], "repository / folder", "scope", "(no scope)", "scope__exact"),
        _by_field(win, grouped["host"], "host", "host", "(no host)", "host__exact"),
        _by_field(win, grouped["outcome"], "outcome", "outcome", "(none)", "outcome__exact"),
    ]
    return CostSummary(win, totals, days, breakdowns)
