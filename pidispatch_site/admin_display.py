"""How the admin writes numbers, times, ids and targets: one place, so every page reads the same.

    money(Decimal("0.00420000000000000")) -> "$0.0042"
    count(12345)                           -> "12,345"
    instant(dt)                            -> "2026-12-01 15:04:05 UTC"
    short_id("gh-8f3c...e21")              -> <span title="the whole id">gh-8f3c…e21</span>
    target_link("github", "acme/web#7")    -> <a href="https://github.com/acme/web/issues/7">acme/web#7</a>
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings
from django.utils import timezone
from django.utils.html import format_html

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


_TARGET = re.compile(r"^(?P<repo>[^#!\s]+)(?P<sep>[#!])(?P<number>\d+)$")


def _web_root(kind: str) -> str:
    if kind == "github":
        api = settings.GITHUB_API_URL.rstrip("/")
        if api == "https://api.github.com":
            return "https://github.com"
        return api[:-len("/api/v3")] if api.endswith("/api/v3") else api  # Enterprise, or the local stand-in
    if kind == "gitlab":
        return settings.GITLAB_URL.rstrip("/")
    if kind == "forgejo":
        return (settings.FORGEJO_URL or "").rstrip("/")
    return ""  # Azure DevOps: a work item's address needs its project, which the target does not carry


def target_url(kind: str, target: str) -> str:
    """The forge's own page of an issue or pull request, or "" when it cannot be known."""
    match = _TARGET.match(target or "")
    root = _web_root(kind)
    if not match or not root:
        return ""
    repo, sep, number = match["repo"], match["sep"], match["number"]
    if kind == "gitlab":
        return f"{root}/{repo}/-/{'merge_requests' if sep == '!' else 'issues'}/{number}"
    return f"{root}/{repo}/issues/{number}"  # GitHub and Forgejo redirect an issue link to its pull request


def target_link(kind: str, target: str) -> str:
    url = target_url(kind, target)
    if not url:
        return target or "-"
    return format_html('<a href="{}" rel="noreferrer">{}</a>', url, target)
