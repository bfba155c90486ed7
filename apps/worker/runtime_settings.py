"""The settings a job runs under: the DB settings row over the environment over the defaults.

An overlay that cannot be read, or holds a value no job could run under, refuses every job
(`settings-overlay-invalid`) before any spend: guessing a cap is worse than not running.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DatabaseError

MEMORY_PATTERN = re.compile(r"^[1-9][0-9]*[kmg]$", re.IGNORECASE)


class SettingsInvalid(Exception):
    """The overlay is unreadable or invalid; the message names the field (never a secret)."""


@dataclass(frozen=True)
class RuntimeSettings:
    daily_cap: int | None
    weekly_cap: int | None
    monthly_cap: int | None
    soft_hold_pct: int | None
    max_turns: int
    max_tokens: int | None
    daily_token_cap: int | None
    job_memory: str
    job_cpus: float
    concurrency: int | None  # containers one host runs at once; None: one per worker process


def validate_overlay(row) -> None:
    errors = {}
    for name in ("daily_cap", "weekly_cap", "monthly_cap", "max_turns", "max_tokens", "daily_token_cap",
                 "concurrency"):
        value = getattr(row, name)
        if value is not None and value < 1:
            errors[name] = "must be at least 1 (leave it blank to use the environment's value)."
    if row.soft_hold_pct is not None and not 1 <= row.soft_hold_pct <= 99:
        errors["soft_hold_pct"] = "must be between 1 and 99."
    if row.job_memory and not MEMORY_PATTERN.fullmatch(row.job_memory):
        errors["job_memory"] = "must be a size like 512m or 4g."
    if row.job_cpus is not None and not 0 < row.job_cpus <= 256:
        errors["job_cpus"] = "must be more than 0 and at most 256."
    if errors:
        raise ValidationError(errors)


def _pick(row_value, env_value):
    return env_value if row_value in (None, "") else row_value


def current() -> RuntimeSettings:
    from .models import DispatchSettings

    try:
        row = DispatchSettings.objects.filter(pk=1).first()
    except DatabaseError:
        raise SettingsInvalid("the settings row could not be read") from None
    if row is not None:
        try:
            validate_overlay(row)
        except ValidationError as exc:
            raise SettingsInvalid(f"invalid settings row fields: {', '.join(sorted(exc.message_dict))}") from None
    else:
        row = DispatchSettings()
    return RuntimeSettings(
        daily_cap=_pick(row.daily_cap, settings.PI_DAILY_CAP),
        weekly_cap=_pick(row.weekly_cap, settings.PI_WEEKLY_CAP),
        monthly_cap=_pick(row.monthly_cap, settings.PI_MONTHLY_CAP),
        soft_hold_pct=_pick(row.soft_hold_pct, settings.PI_SOFT_HOLD_PCT),
        max_turns=_pick(row.max_turns, settings.PI_MAX_TURNS),
        max_tokens=_pick(row.max_tokens, settings.PI_MAX_TOKENS),
        daily_token_cap=_pick(row.daily_token_cap, settings.PI_DAILY_TOKEN_CAP),
        job_memory=_pick(row.job_memory, settings.PI_JOB_MEMORY),
        job_cpus=float(_pick(row.job_cpus, settings.PI_JOB_CPUS)),
        concurrency=_pick(row.concurrency, settings.PI_CONCURRENCY),
    )


def live_concurrency() -> int | None:
    """PI_CONCURRENCY as it applies now. Read before the settings gate (the host slot is gate 4): an
    unusable row gives the environment's value here, and gate 5 then refuses the job before it spends."""
    try:
        return current().concurrency
    except SettingsInvalid:
        return settings.PI_CONCURRENCY
