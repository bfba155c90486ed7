"""How the admin writes numbers, times, ids and targets: one place, so every page reads the same.

    money(Decimal("0.00420000000000000")) -> "$0.0042"
    count(12345)                           -> "12,345"
    instant(dt)                            -> "2026-12-01 15:04:05 UTC"
    short_id("gh-8f3c...e21")              -> <span title="the whole id">gh-8f3c…e21</span>
    target_link("github", "acme/web#7")    -> <a href="https://github.com/acme/web/issues/7">acme/web#7</a>
    published_url("github", "acme/web#7", 41, stored) -> "https://github.com/acme/web/pull/41"
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings
from django.utils import timezone
from django.utils.html import format_html

from apps import forge_registry

SHORT_ID_CHARS = 17


def money(value) -> str:
    """Dollars as every page shows them: cents from a dollar up (`$1,234.50`), four places below a dollar, where a
    run's cost lives (`$0.0252`, `$0.50`)."""
    if value is None or value == "":
        return "-"
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    if amount == 0:
        return "$0.00"
    if abs(amount) < 1:
        places = f"{amount.quantize(Decimal('0.0001'), ROUND_HALF_UP):.4f}".rstrip("0")
        return "$" + places + "0" * max(0, 2 - len(places.split(".")[1]))
    return f"${amount.quantize(Decimal('0.01'), ROUND_HALF_UP):,}"


def count(value) -> str:
    """A count with thousands separators (`12,345`), the same on every page (tokens today, runs)."""
    return "—" if value is None else f"{int(value):,}"


def instant(moment: datetime | None) -> str:
    """Seconds and the zone, always (the operator compares these with log lines)."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or settings.TIME_ZONE}"


def short_id(job_id: str, limit: int = SHORT_ID_CHARS) -> str:
    """A long job id cut in the middle, the whole id on hover."""
    if not job_id or len(job_id) <= limit:
        return format_html('<span class="job-id">{}</span>', job_id or "-")
    keep = (limit - 1) // 2
    return format_html('<span class="job-id" title="{}">{}…{}</span>', job_id, job_id[:keep], job_id[-keep:])


def target_url(kind: str, target: str) -> str:
    """The forge's own page of an issue or pull request, or "" when it cannot be known (the forge registry builds
    every such link from the web root this deployment is configured with)."""
    return forge_registry.target_url(kind, target)


def published_url(kind: str, target: str, pull_request: int | None, publish_url: str, outcome: str = "") -> str:
    """The page of the pull/merge request a run published to, on the forge as this deployment is configured; the
    address the record keeps when the registry cannot build one (a forge no longer served). "" when nothing was
    published to a pull/merge request."""
    if not publish_url and outcome != "published":
        return ""
    repo = re.split(r"[#!]", target or "", maxsplit=1)[0]
    built = forge_registry.pull_url(kind, repo, pull_request) if pull_request and kind in forge_registry.NAMES else ""
    return built or publish_url or ""


def target_link(kind: str, target: str) -> str:
    url = target_url(kind, target)
    if not url:
        return target or "-"
    return format_html('<a href="{}" rel="noreferrer">{}</a>', url, target)
