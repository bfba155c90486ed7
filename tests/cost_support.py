"""Run records for the cost page's tests: placed on UTC days counted back from today, metered by the gateway or
estimated (the runner's own claim), with a per-model usage ledger."""

from datetime import UTC, timedelta
from decimal import Decimal

from django.utils import timezone

from apps.worker.models import Run


def day_instant(days_ago: int):
    """An instant inside the UTC day `days_ago` days back, never in the future."""
    now = timezone.now().astimezone(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight - timedelta(days=days_ago) + (now - midnight) / 2


def make_run(job_id: str, days_ago: int = 0, *, cost=None, tokens=0, metered=True, model="claude-sonnet-4-5",
             outcome="completed", **fields) -> Run:
    started = day_instant(days_ago)
    values = dict(kind="github", target="acme/web#7", scope="github:acme/web", flow="fix-bug", host="hostA",
                  queue="pi-jobs", started_at=started, ended_at=started + timedelta(minutes=3), outcome=outcome,
                  budget_reserved=True, tokens_total=tokens or None,
                  tokens_in=(tokens * 4 // 5) or None, tokens_out=(tokens - tokens * 4 // 5) or None)
    if cost is not None:
        values["cost"] = Decimal(str(cost))
    if tokens:
        row = {"provider": "anthropic", "model": model, "calls": 3, "input": tokens * 4 // 5,
               "output": tokens - tokens * 4 // 5, "total": tokens}
        if cost is not None:
            row["cost"] = str(Decimal(str(cost)).quantize(Decimal("0.000001")))
        values["usage"] = {"source": "gateway", "models": [row]} if metered else {"models": [row]}
    values.update(fields)
    return Run.objects.create(job_id=job_id, **values)
