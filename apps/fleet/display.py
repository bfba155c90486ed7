"""How the fleet's numbers read, the same in `fleet status` and the admin panel."""

from __future__ import annotations

import time


def age(seconds: float | None) -> str:
    """45s, 12m, 3h05m, 2d."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d"


def instant(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def iso_instant(ts: float | None) -> str | None:
    """As JSON documents give an instant (`fleet status --json`, `held_jobs --json`)."""
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def detail_text(detail: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in (detail or {}).items())
