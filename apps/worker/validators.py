"""The rules of the worker's editable rows, in one place: the field validators the models' fields carry
(scoped limits, the settings row), and the rules across fields. The admin's forms, the API's serializers and
the importers run both (`full_clean`); the runtime checks the live settings row with both too, so a row written
around them (a database edit) is refused rather than believed."""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator

from apps.worker.gates.money import MoneyError, parse_usd

MEMORY_PATTERN = re.compile(r"^[1-9][0-9]*[kmg]$", re.IGNORECASE)

# --- field validators ---------------------------------------------------------------------------------------

limit_count = MinValueValidator(1, "must be at least 1 (leave it blank for no limit).")
setting_count = MinValueValidator(1, "must be at least 1 (leave it blank to use the environment's value).")
percent_band = [MinValueValidator(1, "must be between 1 and 99."), MaxValueValidator(99, "must be between 1 and 99.")]
memory_size = RegexValidator(MEMORY_PATTERN, "must be a size like 512m or 4g.")


def cpu_count(value) -> None:
    if not 0 < value <= 256:
        raise ValidationError("must be more than 0 and at most 256.")


def dollar_amount(value) -> None:
    try:
        parse_usd(value)
    except MoneyError as error:
        raise ValidationError(f"{error}.") from None


def field_errors(row, names) -> dict[str, str]:
    """Each named field's first broken rule, by the field's own validators."""
    errors = {}
    for name in names:
        field = row._meta.get_field(name)
        value = getattr(row, name)
        if value in field.empty_values:
            continue
        for validator in field.validators:
            try:
                validator(value)
            except ValidationError as error:
                errors[name] = error.messages[0]
                break
    return errors


# --- rules across fields ------------------------------------------------------------------------------------

def validate_scoped_limit(limit) -> None:
    """A scoped limit names one scope, caps something, and is the only row for its repository."""
    from apps.worker.gates.scopes import ScopeError, bare_repo, parse_scope
    from apps.worker.models import ScopedLimit

    errors = {}
    try:
        limit.scope = parse_scope(limit.scope, allow_everything=False)
    except ScopeError as exc:
        errors["scope"] = str(exc)
    capped = ("day", "week", "month", "concurrent", "day_usd", "week_usd", "month_usd")
    if all(getattr(limit, name) is None for name in capped):
        errors["day"] = "set at least one of day, week, month, concurrent or a dollar window."
    if "scope" not in errors and not limit.scope.startswith("/"):
        # A bare row and a forge-qualified row for one repo would make two answers to "which cap applies".
        repo = bare_repo(limit.scope)
        siblings = ScopedLimit.objects.exclude(pk=limit.pk).filter(scope__endswith=repo)
        clash = next((row.scope for row in siblings if bare_repo(row.scope) == repo and row.scope != limit.scope), None)
        if clash:
            errors["scope"] = f"conflicts with the limit for {clash}: keep either the bare or the forge-qualified row."
    dollar_windows = [name for name in ("day_usd", "week_usd", "month_usd") if getattr(limit, name) is not None]
    if dollar_windows and _deployment_per_run_cap() is None:
        errors.setdefault(dollar_windows[0], NEEDS_PER_RUN_CAP)
    if errors:
        raise ValidationError(errors)


NEEDS_PER_RUN_CAP = ("a dollar window needs a per-run cap, and none is set: set “max cost per run” on the dispatch "
                     "settings page (or PI_MAX_COST_USD), or leave the dollar windows blank. Without it every run "
                     "in this scope would be refused (cost-cap-unset).")


def _deployment_per_run_cap() -> int | None:
    """The per-run cap every job has (the settings row over PI_MAX_COST_USD), in micro-dollars; a trigger's
    run.maxCostUsd only lowers it, and a manual run has none of its own."""
    from apps.worker.gates import runtime_settings

    try:
        return runtime_settings.current().max_cost_micros
    except runtime_settings.SettingsInvalid:
        return runtime_settings.from_environment().max_cost_micros


DISPATCH_FIELDS = ("daily_cap", "weekly_cap", "monthly_cap", "soft_hold_pct", "max_turns", "max_tokens",
                   "daily_token_cap", "job_memory", "job_cpus", "concurrency", "max_cost_usd", "daily_cost_usd",
                   "weekly_cost_usd", "monthly_cost_usd", "lost_retries")


def validate_dispatch_settings(row, *, fields: bool = False) -> None:
    """A dollar window needs a per-job cap, and no smaller than it (every job would be refused). `fields`: the
    fields' own rules too, for a row that did not come through a form (the runtime's check of the live row)."""
    from apps.worker.gates.runtime_settings import DOLLAR_FIELDS, WINDOW_FIELDS

    errors = field_errors(row, DISPATCH_FIELDS) if fields else {}
    if not any(name in errors for name in DOLLAR_FIELDS):
        env = {name: getattr(settings, variable) for name, variable in DOLLAR_FIELDS.items()}
        effective = {name: env[name] if getattr(row, name) in (None, "") else getattr(row, name)
                     for name in DOLLAR_FIELDS}
        try:
            per_job = parse_usd(effective["max_cost_usd"])
            windows = [name for name in WINDOW_FIELDS if effective[name] not in (None, "")]
            if windows and per_job is None:
                errors[windows[0]] = ("a dollar window needs a per-job cap: set the max cost per run here (or "
                                      "PI_MAX_COST_USD), or leave the window blank.")
            if per_job is None and not windows and not fields:
                # Checked where the row is saved, not by the runtime: a scoped limit's window would then refuse
                # every run in its scope (cost-cap-unset), so the cap it relies on cannot be cleared.
                from apps.worker.models import ScopedLimit

                relying = ScopedLimit.objects.exclude(day_usd=None, week_usd=None, month_usd=None).first()
                if relying is not None:
                    errors["max_cost_usd"] = (f"the scoped limit for {relying.scope} has a dollar window, which needs "
                                              "a per-run cap: keep one here (or PI_MAX_COST_USD), or clear that "
                                              "limit's dollar windows first.")
            for name in windows:
                if per_job is not None and parse_usd(effective[name]) < per_job:
                    errors[name] = ("is smaller than the max cost per run: every run holds that much first, so "
                                    "every job would be refused (dollar-cap).")
        except MoneyError:
            pass  # an environment value this row inherits: `manage.py check` and every start refuse it
    if errors:
        raise ValidationError(errors)
