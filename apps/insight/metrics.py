"""`/metrics`: Prometheus text computed at scrape time from the database and Redis.

A custom collector, not counters kept in process memory: gunicorn's and the workers' processes share nothing
but the database and Redis, and every process answers the same numbers from them (multi-process safe, no
`PROMETHEUS_MULTIPROC_DIR`). Run records are append-only and the ones housekeeping prunes go on counting
(apps/insight/models.py, PrunedRuns), so their counts are true counters; the inbox's rows change status and
settled ones are pruned, so deliveries are a gauge. A source that cannot be read reports
`pidispatch_source_up{source=...} 0` and its families are left out rather than reported as zero.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, timedelta

from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from redis.exceptions import RedisError

logger = logging.getLogger("pidispatch.metrics")

# The run reasons that the job's egress gateway decides (apps/worker/sandbox/gateway.py and container_step.classify):
# it records no counter of its own, so its refusals are counted from the runs they ended.
GATEWAY_REASONS = ("token-budget", "daily-token-cap", "cost-cap", "model-not-allowed", "model-unpriced",
                   "request-malformed", "usage-unreadable", "egress-denied", "provider-auth-refused")

CALLS_SQL = {
    # Provider calls the gateway forwarded, from the per-model ledger it wrote on each run ("source": "gateway").
    "sqlite": """SELECT COALESCE(SUM(json_extract(m.value, '$.calls')), 0)
                 FROM {table} r, json_each(r.usage, '$.models') m
                 WHERE r.started_at >= %s AND json_extract(r.usage, '$.source') = 'gateway'""",
    "postgresql": """SELECT COALESCE(SUM((m.value->>'calls')::bigint), 0)
                     FROM {table} r CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN
                         jsonb_typeof(r.usage->'models') = 'array' THEN r.usage->'models' ELSE '[]'::jsonb END) m
                     WHERE r.started_at >= %s AND r.usage->>'source' = 'gateway'""",
}


def _runs_by_reason() -> list[dict]:
    """Every run record by outcome and reason, with its dollars and tokens, from per-day partials over the whole
    history (closed days kept in Redis as the cost page keeps its own), so a scrape reads yesterday and today
    from the database, not every row. The records housekeeping pruned still count (PrunedRuns)."""
    from . import costs

    first_day = costs.first_day()
    if first_day is None:
        return []
    now = timezone.now()
    today = now.astimezone(UTC).date()
    days = [first_day + timedelta(days=n) for n in range((today - first_day).days + 1)]
    return costs.merged(costs.day_partials(days, now, "reasons"), "reason")


class DispatchCollector:
    def __init__(self, redis_factory=None):
        self._redis_factory = redis_factory

    def _redis(self):
        if self._redis_factory:
            return self._redis_factory()
        from apps.fleet.connection import get_redis

        return get_redis()

    def collect(self):
        up = GaugeMetricFamily("pidispatch_source_up", "1 when the source could be read for this scrape.",
                               labels=["source"])
        families = []
        for source, part in (("database", self._database), ("redis", self._redis_families),
                             ("budget", self._budget)):
            try:
                families += list(part())
                up.add_metric([source], 1)
            except (DatabaseError, RedisError, OSError) as exc:
                logger.warning("metrics_source_down source=%s error=%s", source, type(exc).__name__)
                up.add_metric([source], 0)
        yield up
        yield from families

    # --- the database: runs and deliveries ------------------------------------------------------------

    def _database(self):
        from apps.receiver.models import Delivery
        from apps.worker.models import AcceptedJob, JobsRebuilt, Run
        from apps.worker.spend import windows

        runs = CounterMetricFamily("pidispatch_runs", "Run records (one per attempt) by outcome and reason.",
                                   labels=["outcome", "reason"])
        refusals = CounterMetricFamily("pidispatch_gateway_refusals",
                                       "Runs the job's egress gateway stopped or refused, by reason.",
                                       labels=["reason"])
        cost = CounterMetricFamily("pidispatch_run_cost_dollars", "Dollars the run records cost (priced runs).")
        project_cost = CounterMetricFamily("pidispatch_project_cost_dollars",
                                           "Dollars the run records cost, by the project each run was enqueued "
                                           "under (\"\": none).", labels=["project"])
        tokens = CounterMetricFamily("pidispatch_run_tokens", "Tokens the run records used.")
        total_cost, total_tokens, refused = 0, 0, dict.fromkeys(GATEWAY_REASONS, 0)
        by_reason, by_project = {}, {}
        for row in _runs_by_reason():
            key = (row["outcome"], row["reason"])
            by_reason[key] = by_reason.get(key, 0) + row["runs"]
            by_project[row["project"]] = by_project.get(row["project"], 0) + row["spend"]
            total_cost += row["spend"]
            total_tokens += row["tokens"]
            if row["reason"] in refused:
                refused[row["reason"]] += row["runs"]
        for (outcome, reason), count in by_reason.items():
            runs.add_metric([outcome, reason], count)
        for project, spend in sorted(by_project.items()):
            project_cost.add_metric([project], float(spend))
        cost.add_metric([], float(total_cost))
        tokens.add_metric([], float(total_tokens))
        for reason, n in refused.items():
            refusals.add_metric([reason], n)

        calls = GaugeMetricFamily("pidispatch_gateway_calls_today",
                                  "Provider calls forwarded by the egress gateways, runs started this UTC day.")
        sql = CALLS_SQL.get(connection.vendor)
        if sql:
            with transaction.atomic(), connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute("SET LOCAL jit = off")  # as on the cost page: a guessed 100 rows a ledger
                cursor.execute(sql.format(table=connection.ops.quote_name(Run._meta.db_table)),
                               [windows(timezone.now())["day"]])
                calls.add_metric([], float(cursor.fetchone()[0] or 0))

        deliveries = GaugeMetricFamily("pidispatch_deliveries", "Deliveries in the inbox by forge and status.",
                                       labels=["forge", "status"])
        for row in Delivery.objects.order_by().values("forge", "status").annotate(n=Count("id")):
            deliveries.add_metric([row["forge"], row["status"]], row["n"])

        rebuilt = CounterMetricFamily("pidispatch_jobs_rebuilt", "Accepted jobs Redis had lost and that were queued "
                                      "again from the database (apps/worker/accepted.py).")
        rebuilt.add_metric([], JobsRebuilt.objects.aggregate(n=Sum("jobs"))["n"] or 0)
        open_jobs = GaugeMetricFamily("pidispatch_accepted_jobs_open", "Accepted jobs not settled yet (queued, "
                                      "deferred or running): what a Redis that lost its data gets back.")
        open_jobs.add_metric([], AcceptedJob.objects.filter(settled_at__isnull=True).count())
        return [runs, refusals, cost, project_cost, tokens, calls, deliveries, rebuilt, open_jobs]

    # --- Redis: queues, pauses, hosts ---------------------------------------------------------------

    def _redis_families(self):
        from rq import Queue
        from rq.job import Job
        from rq.utils import utcparse

        from apps.fleet import status
        from apps.fleet.connection import text

        redis = self._redis()
        snapshot = status.snapshot(redis)
        jobs = GaugeMetricFamily("pidispatch_jobs", "Jobs by queue and state (queued, scheduled: deferred or held, "
                                 "started, failed).", labels=["queue", "state"])
        depth = GaugeMetricFamily("pidispatch_queue_depth", "Jobs waiting in the queue to be taken.", labels=["queue"])
        oldest = GaugeMetricFamily("pidispatch_queue_oldest_job_age_seconds",
                                   "How long the queue's oldest waiting job has waited (0 when empty).",
                                   labels=["queue"])
        paused = GaugeMetricFamily("pidispatch_queue_paused", "1 while the queue is paused.", labels=["queue"])
        pipe = redis.pipeline(transaction=False)
        for queue in snapshot.queues:
            pipe.lindex(Queue(queue.name, connection=redis).key, 0)  # RQ takes from the head: the oldest
        heads = pipe.execute()
        pipe = redis.pipeline(transaction=False)
        for head in filter(None, heads):
            pipe.hget(Job.key_for(text(head)), "enqueued_at")
        found = iter(pipe.execute())
        enqueued = [next(found) if head else None for head in heads]
        now = time.time()
        for queue, head, at in zip(snapshot.queues, heads, enqueued, strict=True):
            for state, value in (("queued", queue.queued), ("scheduled", queue.scheduled),
                                 ("started", queue.running), ("failed", queue.failed)):
                jobs.add_metric([queue.name, state], value)
            depth.add_metric([queue.name], queue.queued)
            age = 0.0
            if head and at:
                try:
                    age = max(0.0, now - utcparse(text(at)).timestamp())
                except ValueError:
                    age = 0.0
            oldest.add_metric([queue.name], round(age, 3))
            paused.add_metric([queue.name], 1 if queue.paused else 0)
        hosts = GaugeMetricFamily("pidispatch_hosts", "Worker hosts in the registry by liveness (live: routable).",
                                  labels=["liveness"])
        counts = {"live": 0, "stale": 0, "gone": 0}
        for host in snapshot.hosts or ():
            counts[host.liveness] = counts.get(host.liveness, 0) + 1
        for liveness, n in counts.items():
            hosts.add_metric([liveness], n)
        return [jobs, depth, oldest, paused, hosts, *self._host_budgets(snapshot)]

    @staticmethod
    def _host_budgets(snapshot):
        """Each host's budget and what its jobs hold of it, by project (apps/worker/gates/host_budget.py)."""
        budget = GaugeMetricFamily("pidispatch_host_budget", "A host's budget (memory in bytes, CPUs); absent: off or "
                                   "not said.", labels=["host", "resource"])
        in_use = GaugeMetricFamily("pidispatch_host_budget_in_use", "What a host's admitted jobs hold of its budget, "
                                   "by project (\"\": none).", labels=["host", "resource", "project"])
        waiting = GaugeMetricFamily("pidispatch_host_budget_waiting", "Jobs waiting for room on the host.",
                                    labels=["host"])
        for host in snapshot.hosts or ():
            for resource, value, scale in (("memory", host.budget_memory, 1024 * 1024),
                                           ("cpus", host.budget_cpus, 0.01)):
                if value.isdigit():
                    budget.add_metric([host.name, resource], int(value) * scale)
            usage = snapshot.usage.get(host.name)
            if usage is None:
                continue
            for project, (memory, cpus, _) in usage.by_project.items():
                label = "" if project == "-" else project
                in_use.add_metric([host.name, "memory", label], memory * 1024 * 1024)
                in_use.add_metric([host.name, "cpus", label], cpus / 100)
            waiting.add_metric([host.name], usage.waiting)
        return [budget, in_use, waiting]

    # --- the budget: counters against caps ---------------------------------------------------------------

    def _budget(self):
        from apps.worker.spend import OFF, OK, OVER, SOFT_HOLD, budget_in_force

        budget = budget_in_force(self._redis())
        labels = ["ledger", "window", "scope"]  # scope: a scoped limit's, "" for the deployment
        used = GaugeMetricFamily("pidispatch_budget_used", "Spent (or reserved, refusals included) in the window: "
                                 "jobs, tokens or dollars.", labels=labels)
        held = GaugeMetricFamily("pidispatch_budget_held", "Reserved and not yet settled in the window.", labels=labels)
        cap = GaugeMetricFamily("pidispatch_budget_cap", "The cap in force for the window (absent: no cap).",
                                labels=labels)
        state = GaugeMetricFamily("pidispatch_budget_state", "1 for the window's state (ok, soft hold, over, off).",
                                  labels=[*labels, "state"])
        for line in budget.lines:
            key = [line.ledger, line.window, line.scope]
            used.add_metric(key, float(line.used))
            held.add_metric(key, float(line.held))
            if line.cap:
                cap.add_metric(key, float(line.cap))
            for name in (OK, SOFT_HOLD, OVER, OFF):
                state.add_metric([*key, name], 1 if line.state == name else 0)
        return [used, held, cap, state]
