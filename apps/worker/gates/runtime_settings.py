"""The settings a job runs under: the DB settings row over the environment over the defaults.

An overlay that cannot be read, or holds a value no job could run under, refuses every job
(`settings-overlay-invalid`) before any spend: guessing a cap is worse than not running. That includes a
dollar window (day, week, month) with no per-job dollar cap, in the row or the environment: a window holds
each job's cap before it starts, so without one it could not bound what a run spends.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import DatabaseError

from apps.worker.gates.money import MoneyError, parse_usd, to_usd


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
    # Dollar caps (None: no cap); the budget counts them in micro-dollars (the *_micros properties).
    max_cost_usd: Decimal | None = None
    daily_cost_usd: Decimal | None = None
    weekly_cost_usd: Decimal | None = None
    monthly_cost_usd: Decimal | None = None
    lost_retries: int = 1  # runs again after the worker running it died (apps/worker/process/worker_lost.py)

    @property
    def max_cost_micros(self) -> int | None:
        return parse_usd(self.max_cost_usd)

    @property
    def daily_cost_micros(self) -> int | None:
        return parse_usd(self.daily_cost_usd)

    @property
    def weekly_cost_micros(self) -> int | None:
        return parse_usd(self.weekly_cost_usd)

    @property
    def monthly_cost_micros(self) -> int | None:
        return parse_usd(self.monthly_cost_usd)


# The dollar settings: the row's field, its environment variable.
DOLLAR_FIELDS = {"max_cost_usd": "PI_MAX_COST_USD", "daily_cost_usd": "PI_DAILY_COST_USD",
                 "weekly_cost_usd": "PI_WEEKLY_COST_USD", "monthly_cost_usd": "PI_MONTHLY_COST_USD"}
WINDOW_FIELDS = ("daily_cost_usd", "weekly_cost_usd", "monthly_cost_usd")


def environment_dollars() -> dict[str, int | None]:
    """The environment's dollar caps in micro-dollars, by row field. Raises ImproperlyConfigured naming the
    variable and what to set (what `manage.py check` and every process's start report)."""
    values = {}
    for name, variable in DOLLAR_FIELDS.items():
        try:
            values[name] = parse_usd(getattr(settings, variable))
        except MoneyError as error:
            raise ImproperlyConfigured(f"{variable} {error}.") from None
    windows = [DOLLAR_FIELDS[name] for name in WINDOW_FIELDS if values[name] is not None]
    if windows and values["max_cost_usd"] is None:
        raise ImproperlyConfigured(
            f"{', '.join(windows)} set without a per-job cap: set PI_MAX_COST_USD too (each run holds that much of "
            "the window before it starts), or unset the window.")
    return values


def _pick(row_value, env_value):
    return env_value if row_value in (None, "") else row_value


def current() -> RuntimeSettings:
    from apps.worker.models import DispatchSettings
    from apps.worker.validators import validate_dispatch_settings

    try:
        row = DispatchSettings.objects.filter(pk=1).first()
    except DatabaseError:
        raise SettingsInvalid("the settings row could not be read") from None
    if row is not None:
        try:
            validate_dispatch_settings(row, fields=True)
        except ValidationError as exc:
            named = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in sorted(exc.message_dict.items()))
            raise SettingsInvalid(f"invalid settings row fields: {named}") from None
    else:
        row = DispatchSettings()
    return _resolve(row)


def from_environment() -> RuntimeSettings:
    """The environment's settings alone (for readers that must show something while the row is unusable)."""
    from apps.worker.models import DispatchSettings

    return _resolve(DispatchSettings())


def _resolve(row) -> RuntimeSettings:
    env_dollars = environment_dollars()
    dollars = {name: parse_usd(row_value) if (row_value := getattr(row, name)) is not None else env_dollars[name]
               for name in DOLLAR_FIELDS}
    return RuntimeSettings(
        **{name: to_usd(micros) for name, micros in dollars.items()},
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
        lost_retries=_pick(row.lost_retries, settings.PI_LOST_RETRIES),
    )


def live_concurrency() -> int | None:
    """PI_CONCURRENCY as it applies now. Read before the settings gate (the host slot is gate 4): an
    unusable row gives the environment's value here, and gate 5 then refuses the job before it spends."""
    try:
        return current().concurrency
    except SettingsInvalid:
        return settings.PI_CONCURRENCY


def live_lost_retries() -> int:
    """PI_LOST_RETRIES as it applies now, read by whichever worker settles a lost job (any host's sweep may):
    the row gives every host one answer. An unusable row gives the environment's value."""
    try:
        return current().lost_retries
    except SettingsInvalid:
        return settings.PI_LOST_RETRIES
