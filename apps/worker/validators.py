"""The rules of the worker's editable rows, in one place: the field validators the models' fields carry
(scoped limits, the settings row), and the rules across fields. The admin's forms, the API's serializers and
the importers run both (`full_clean`); the runtime checks the live settings row with both too, so a row written
around them (a database edit) is refused rather than believed."""

from __future__ import annotations

import contextlib
import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator

from apps.worker.gates.money import MoneyError, parse_usd

MEMORY_PATTERN = re.compile(r"^[1-9][0-9]*[kmg]$", re.IGNORECASE)

# --- field validators ---------------------------------------------------------------------------------------

limit_count = MinValueValidator(1, "must be at least 1 (leave it blank for no limit).")
setting_count = MinValueValidator(1, "must be at least 1 (leave it blank to use the environment's value).")
# A run's turns, wherever a person sets them (a trigger's run.maxTurns, a manual run's form and API, the settings
# row): a whole number, at least this.
MIN_TURNS = 1
TURNS_RULE = f"a whole number of turns, at least {MIN_TURNS}"


def turns_problem(value) -> str | None:
    """What is wrong with a run's turn budget, or None (None itself is "the deployment's")."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < MIN_TURNS:
        return TURNS_RULE
    return None
percent_band = [MinValueValidator(1, "must be between 1 and 99."), MaxValueValidator(99, "must be between 1 and 99.")]
memory_size = RegexValidator(MEMORY_PATTERN, "must be a size like 512m or 4g.")


PROJECT_SLUG = re.compile(r"^[a-z0-9-]{1,32}$")
project_slug = RegexValidator(PROJECT_SLUG, "must be 1-32 lowercase letters, digits and '-'.")
host_share_band = [MinValueValidator(1, "must be between 1 and 100 (percent)."),
                   MaxValueValidator(100, "must be between 1 and 100 (percent).")]
PROJECT_MEMORY = re.compile(r"^([1-9][0-9]*)([mg])$", re.IGNORECASE)
PROJECT_MEMORY_MIB = (512, 1024 * 1024)


def canonical_memory(value: str) -> str:
    """A project row's memory as the ancestor writes it ("1024m" is "1g"), or ValidationError."""
    match = PROJECT_MEMORY.fullmatch(value or "")
    if not match:
        raise ValidationError("must be a size like 512m or 8g (m or g).")
    mib = int(match[1]) * (1024 if match[2].lower() == "g" else 1)
    if not PROJECT_MEMORY_MIB[0] <= mib <= PROJECT_MEMORY_MIB[1]:
        raise ValidationError("must be from 512m to 1024g.")
    return f"{mib // 1024}g" if mib % 1024 == 0 else f"{mib}m"


def project_memory(value) -> None:
    canonical_memory(value)


def project_cpus(value) -> None:
    if not 0.25 <= value <= 256:
        raise ValidationError("must be at least 0.25 and at most 256.")


def project_members(value) -> None:
    from apps.worker.gates.scopes import ScopeError, parse_member

    if not isinstance(value, list) or not value:
        raise ValidationError("list at least one member: a forge-qualified repository or an absolute folder.")
    for member in value:
        try:
            parse_member(member)
        except ScopeError as exc:
            raise ValidationError(str(exc)) from None


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

COUNT_FIELDS = ("day", "week", "month", "concurrent")
DOLLAR_FIELDS = ("day_usd", "week_usd", "month_usd")
SIZE_FIELDS = ("memory", "cpus", "host_share", "min_jobs")


def validate_project(project, others=None) -> None:
    """A project's members are canonical, listed once, and in no other project (`others`: the projects to
    compare with; the saved ones when not given)."""
    from apps.worker.gates.scopes import ScopeError, parse_member
    from apps.worker.models import Project

    if project.pk is not None and Project.objects.filter(pk=project.pk).exclude(slug=project.slug).exists():
        naming = project.limits_naming_it().first()
        if naming is not None:
            raise ValidationError({"slug": f"the scoped limit {naming.scope} names this project: change or delete "
                                           "that row before renaming it."})
    if not isinstance(project.members, list) or not project.members:
        return  # the field's own validator says so
    try:
        members = [parse_member(member) for member in project.members]
    except ScopeError:
        return  # the field's own validator says so
    twice = next((member for index, member in enumerate(members) if member in members[:index]), None)
    if twice:
        raise ValidationError({"members": f"{twice!r} is listed twice."})
    project.members = members
    if others is None:
        others = Project.objects.exclude(pk=project.pk).exclude(slug=project.slug)
    for other in others:
        shared = next((member for member in members if member in other.members), None)
        if shared:
            raise ValidationError({"members": f"{shared!r} is already a member of project {other.slug!r}: a "
                                              "repository or folder belongs to one project."})


def validate_scoped_limit(limit, others=None, *, uncapped_dollars: bool = False) -> None:
    """A scoped limit names one scope, caps something, and is the only row for its repository. Model rows hold
    dollar windows only; sizes go on project rows only, for a project that exists. `others`: the rows to compare
    with (a file's own, for an import that replaces them all); the saved ones when not given. A dollar window
    needs a per-run cap in the deployment, unless `uncapped_dollars` (an ancestor's file imports as it did there:
    its jobs are refused unless their trigger sets one, and `uncapped_dollar_rows` warns of it)."""
    from apps.worker.gates.scopes import MODEL_PREFIX, PROJECT_PREFIX, ScopeError, bare_repo, parse_scope
    from apps.worker.models import Project, ScopedLimit

    errors = {}
    try:
        limit.scope = parse_scope(limit.scope, allow_everything=False, allow_rows=True)
    except ScopeError as exc:
        errors["scope"] = str(exc)
    if limit.memory:
        with contextlib.suppress(ValidationError):  # the field's own validator says so
            limit.memory = canonical_memory(limit.memory)
    is_model = "scope" not in errors and limit.scope.startswith(MODEL_PREFIX)
    is_project = "scope" not in errors and limit.scope.startswith(PROJECT_PREFIX)
    capped = COUNT_FIELDS + DOLLAR_FIELDS + SIZE_FIELDS
    if all(getattr(limit, name) in (None, "") for name in capped):
        errors["day"] = "set at least one of day, week, month, concurrent or a dollar window."
    if is_model:
        for name in COUNT_FIELDS + SIZE_FIELDS:
            if getattr(limit, name) not in (None, ""):
                errors[name] = "a model row holds dollar windows only (day $, week $, month $)."
    elif "scope" not in errors and not is_project:
        for name in SIZE_FIELDS:
            if getattr(limit, name) not in (None, ""):
                errors[name] = "sizes go on project:<id> rows only."
    if is_project:
        slug = limit.scope[len(PROJECT_PREFIX):]
        if not Project.objects.filter(slug=slug).exists():
            errors["scope"] = f"no project {slug!r}: add it to the projects first."
        if limit.min_jobs is not None:
            if not (limit.memory or limit.cpus is not None):
                errors["min_jobs"] = "needs a size (memory or cpus) on the same row."
            elif limit.concurrent is not None and limit.min_jobs > limit.concurrent:
                errors["min_jobs"] = "must be at most concurrent."
    if "scope" not in errors and not limit.scope.startswith(("/", MODEL_PREFIX, PROJECT_PREFIX)):
        # A bare row and a forge-qualified row for one repo would make two answers to "which cap applies".
        repo = bare_repo(limit.scope)
        siblings = ScopedLimit.objects.exclude(pk=limit.pk).filter(scope__endswith=repo) if others is None else others
        clash = next((row.scope for row in siblings if bare_repo(row.scope) == repo and row.scope != limit.scope), None)
        if clash:
            errors["scope"] = f"conflicts with the limit for {clash}: keep either the bare or the forge-qualified row."
    dollar_windows = [name for name in ("day_usd", "week_usd", "month_usd") if getattr(limit, name) is not None]
    if dollar_windows and not uncapped_dollars and _deployment_per_run_cap() is None:
        errors.setdefault(dollar_windows[0], NEEDS_PER_RUN_CAP)
    if errors:
        raise ValidationError(errors)


NEEDS_PER_RUN_CAP = ("a dollar window needs a per-run cap, and none is set: set “max cost per run” on the dispatch "
                     "settings page (or PI_MAX_COST_USD), or leave the dollar windows blank. Without it every run "
                     "in this scope would be refused (cost-cap-unset).")


def uncapped_dollar_rows() -> list[str]:
    """The scoped limits with a dollar window while the deployment has no per-run cap: their jobs are refused
    (cost-cap-unset) unless the trigger sets run.maxCostUsd. Said by the import, the admin and `doctor`."""
    from apps.worker.models import ScopedLimit

    if _deployment_per_run_cap() is not None:
        return []
    return list(ScopedLimit.objects.exclude(day_usd=None, week_usd=None, month_usd=None)
                .order_by("scope").values_list("scope", flat=True))


def uncapped_dollars_warning(scopes: list[str]) -> str:
    shown = ", ".join(scopes[:5]) + (f" and {len(scopes) - 5} more" if len(scopes) > 5 else "")
    return (f"{len(scopes)} scoped limit(s) with a dollar window and no per-run cap anywhere ({shown}): their jobs "
            "are refused (cost-cap-unset) unless their trigger sets run.maxCostUsd. Set “max cost per run” on the "
            "dispatch settings page (or PI_MAX_COST_USD).")


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
