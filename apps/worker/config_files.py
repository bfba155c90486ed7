"""The ancestor's `scoped-limits.json`, `projects.json` and pause-windows JSON files, in and out of the database.

An import is all or nothing: every entry is validated first (with the same rules as the admin), and a
file with any bad entry changes nothing and names the entry, the field and the rule.
"""

from __future__ import annotations

import json
from datetime import date, time
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.worker import validators
from apps.worker.gates.money import MoneyError, parse_usd, to_usd
from apps.worker.models import PauseWindow, Project, ScopedLimit
from pidispatch_site import strict_json

# The file's version says what it may hold, as the ancestor reads it: 1 job counts on repositories and folders;
# 2 adds forge-qualified repositories, `project:<id>` and `model:<provider>/<model>` rows and the dollar windows
# (`dayUsd`, `weekUsd`, `monthUsd`: decimal strings, a JSON number also read); 3 adds the project rows' sizes.
# An export writes the lowest version that holds its rows.
LIMITS_VERSION = 3
LIMIT_FIELDS = ("day", "week", "month", "concurrent")
DOLLAR_KEYS = {"dayUsd": "day_usd", "weekUsd": "week_usd", "monthUsd": "month_usd"}
SIZE_KEYS = {"memory": "memory", "cpus": "cpus", "hostShare": "host_share", "minJobs": "min_jobs"}
PROJECTS_VERSION = 1
PROJECT_KEYS = {"id", "name", "members"}
WINDOW_KEYS = {"scope", "from", "to", "tz", "days", "dateFrom", "dateTo"}
# The ancestor's allocation across projects: refused by name until it is built, never half-read.
NOT_BUILT_YET = {
    "envelope": "the envelope (allocation of a dollar total across projects) is not built yet",
    "portfolio": "portfolio jobs (a run that plans the allocation across projects) are not built yet",
}


class ConfigFileError(ValueError):
    pass


def _load(text: str, what: str) -> dict:
    try:
        document = strict_json.loads(text)
    except strict_json.DuplicateKeyError as duplicate:
        raise ConfigFileError(f"{what}: key {duplicate.key!r} appears twice in one object") from None
    except json.JSONDecodeError as exc:
        raise ConfigFileError(f"{what} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(document, dict):
        raise ConfigFileError(f"{what} must be a JSON object")
    return document


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items())


# --- scoped limits ----------------------------------------------------------------------------------

def _scope_version(scope: str) -> int:
    from apps.worker.gates.scopes import MODEL_PREFIX, PROJECT_PREFIX

    return 2 if scope.startswith((MODEL_PREFIX, PROJECT_PREFIX)) or (":" in scope and not scope.startswith("/")) \
        else 1


def _row_version(limit: ScopedLimit) -> int:
    if any(getattr(limit, name) not in (None, "") for name in SIZE_KEYS.values()):
        return 3
    if any(getattr(limit, name) is not None for name in DOLLAR_KEYS.values()):
        return 2
    return _scope_version(limit.scope)


def parse_limits(text: str) -> list[ScopedLimit]:
    document = _load(text, "scoped-limits file")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigFileError("scoped-limits file: `version` must be an integer >= 1")
    if version > LIMITS_VERSION:
        raise ConfigFileError(f"scoped-limits file written by a newer pi-dispatch (version {version}; this build "
                              f"understands {LIMITS_VERSION})")
    _refuse_not_built(document, "scoped-limits file")
    rows = document.get("limits")
    if not isinstance(rows, list):
        raise ConfigFileError("scoped-limits file: `limits` must be a list")
    limits, seen = [], set()
    for index, row in enumerate(rows):
        where = f"limit at index {index}"
        if not isinstance(row, dict):
            raise ConfigFileError(f"{where} is not an object")
        _refuse_not_built(row, where)
        known = {"scope", *LIMIT_FIELDS, *DOLLAR_KEYS, *SIZE_KEYS}
        unknown = set(row) - known
        if unknown:
            raise ConfigFileError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        needs = [(key, 2, "dollar windows") for key in DOLLAR_KEYS if key in row]
        needs += [(key, 3, "project sizes") for key in SIZE_KEYS if key in row]
        for key, least, what in needs:
            if version < least:
                raise ConfigFileError(f"{where}: unknown key {key!r} ({what} need version {least})")
        values = {name: row.get(name) for name in LIMIT_FIELDS}
        for name, value in values.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigFileError(f"{where}: {name} must be an integer")
        for key, name in DOLLAR_KEYS.items():
            if key in row:
                try:
                    micros = parse_usd(row[key])
                except MoneyError as error:
                    raise ConfigFileError(f"{where}: {key} {error}") from None
                if micros is None:
                    raise ConfigFileError(f"{where}: {key} must be a number of dollars (leave the key out for none)")
                values[name] = to_usd(micros)
        values.update(_sizes(row, where))
        limit = ScopedLimit(scope=row.get("scope"), **values)
        try:
            limit.clean_fields()
            # The file's rows, not those it replaces; dollar rows without a per-run cap import as in the ancestor.
            validators.validate_scoped_limit(limit, others=limits, uncapped_dollars=True)
        except ValidationError as exc:
            raise ConfigFileError(f"{where}: {_errors(exc)}") from None
        if _scope_version(limit.scope) > version:
            raise ConfigFileError(f"{where}: scope {limit.scope!r} needs version 2 (forge-qualified, project: and "
                                  "model: rows)")
        if limit.scope.lower() in seen:
            raise ConfigFileError(f"{where}: scope {limit.scope!r} is listed twice")
        seen.add(limit.scope.lower())
        limits.append(limit)
    return limits


def _sizes(row: dict, where: str) -> dict:
    values = {}
    if "memory" in row:
        if not isinstance(row["memory"], str):
            raise ConfigFileError(f"{where}: memory must be a string like \"8g\"")
        values["memory"] = row["memory"]
    if "cpus" in row:
        cpus = row["cpus"]
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float, str)):
            raise ConfigFileError(f"{where}: cpus must be a number")
        try:
            amount = Decimal(str(cpus))
        except InvalidOperation:
            raise ConfigFileError(f"{where}: cpus must be a number") from None
        if not amount.is_finite() or amount != amount.quantize(Decimal("0.01")):
            raise ConfigFileError(f"{where}: cpus has at most 2 decimals")
        values["cpus"] = amount
    for key in ("hostShare", "minJobs"):
        if key in row:
            if not isinstance(row[key], int) or isinstance(row[key], bool):
                raise ConfigFileError(f"{where}: {key} must be an integer")
            values[SIZE_KEYS[key]] = row[key]
    return values


def import_limits(text: str) -> int:
    limits = parse_limits(text)
    with transaction.atomic():
        ScopedLimit.objects.all().delete()
        ScopedLimit.objects.bulk_create(limits)
    return len(limits)


def limits_warnings() -> list[str]:
    """What the imported limits leave unworkable without being wrong (the import then says it)."""
    uncapped = validators.uncapped_dollar_rows()
    return [validators.uncapped_dollars_warning(uncapped)] if uncapped else []


def export_limits() -> str:
    rows, version = [], 1
    for limit in ScopedLimit.objects.order_by("scope"):
        row = {"scope": limit.scope}
        row.update({name: getattr(limit, name) for name in LIMIT_FIELDS if getattr(limit, name) is not None})
        for key, name in DOLLAR_KEYS.items():
            if getattr(limit, name) is not None:
                row[key] = _usd_text(getattr(limit, name))
        if limit.memory:
            row["memory"] = limit.memory
        if limit.cpus is not None:
            row["cpus"] = float(limit.cpus) if limit.cpus != limit.cpus.to_integral() else int(limit.cpus)
        for key in ("hostShare", "minJobs"):
            if getattr(limit, SIZE_KEYS[key]) is not None:
                row[key] = getattr(limit, SIZE_KEYS[key])
        version = max(version, _row_version(limit))
        rows.append(row)
    return json.dumps({"version": version, "limits": rows}, indent=2) + "\n"


def _usd_text(amount) -> str:
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _refuse_not_built(section: dict, where: str) -> None:
    for key, message in NOT_BUILT_YET.items():
        if key in section:
            raise ConfigFileError(f"{where}: `{key}`: {message}")


# --- projects ---------------------------------------------------------------------------------------

def parse_projects(text: str) -> list[Project]:
    document = _load(text, "projects file")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigFileError("projects file: `version` must be an integer >= 1")
    if version > PROJECTS_VERSION:
        raise ConfigFileError(f"projects file written by a newer pi-dispatch (version {version}; this build "
                              f"understands {PROJECTS_VERSION})")
    _refuse_not_built(document, "projects file")
    entries = document.get("projects")
    if not isinstance(entries, list):
        raise ConfigFileError("projects file: `projects` must be a list")
    projects, seen, owners = [], set(), {}
    for index, entry in enumerate(entries):
        where = f"project at index {index}"
        if not isinstance(entry, dict):
            raise ConfigFileError(f"{where} is not an object")
        _refuse_not_built(entry, where)
        unknown = set(entry) - PROJECT_KEYS
        if unknown:
            raise ConfigFileError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        name = entry.get("name", "")
        if not isinstance(name, str):
            raise ConfigFileError(f"{where}: name must be a string")
        project = Project(slug=entry.get("id"), name=name, members=entry.get("members"))
        try:
            project.clean_fields()
            # Across projects: the file's own, not the rows it replaces.
            validators.validate_project(project, others=[])
        except ValidationError as exc:
            raise ConfigFileError(f"{where}: {_errors(exc)}") from None
        if project.slug in seen:
            raise ConfigFileError(f"{where}: id {project.slug!r} is listed twice")
        seen.add(project.slug)
        for member in project.members:
            if member in owners:
                raise ConfigFileError(f"{where}: {member!r} is already a member of project {owners[member]!r}: a "
                                      "repository or folder belongs to one project")
            owners[member] = project.slug
        projects.append(project)
    return projects


def import_projects(text: str) -> int:
    """Replace the projects. A `project:<id>` scoped limit naming a project the file drops refuses it all (its
    cap would stop applying to anything)."""
    projects = parse_projects(text)
    kept = {project.slug for project in projects}
    with transaction.atomic():
        orphaned = [row.scope for row in ScopedLimit.objects.filter(scope__startswith="project:")
                    if row.scope.removeprefix("project:") not in kept]
        if orphaned:
            raise ConfigFileError(f"the scoped limit {orphaned[0]!r} names a project this file drops: import "
                                  "scoped limits without it first")
        Project.objects.all().delete()
        Project.objects.bulk_create(projects)
    return len(projects)


def export_projects() -> str:
    entries = []
    for project in Project.objects.order_by("slug"):
        entry = {"id": project.slug}
        if project.name:
            entry["name"] = project.name
        entry["members"] = project.members
        entries.append(entry)
    return json.dumps({"version": PROJECTS_VERSION, "projects": entries}, indent=2) + "\n"


def import_envelope(text: str) -> int:
    """The ancestor's envelope.json: refused by name (the allocation across projects is not built yet)."""
    _load(text, "envelope file")
    raise ConfigFileError(f"envelope file: {NOT_BUILT_YET['envelope']}")


# --- pause windows ----------------------------------------------------------------------------------

def _clock(value, where: str, key: str) -> time:
    try:
        if not isinstance(value, str) or len(value) != 5:
            raise ValueError
        return time.fromisoformat(value)
    except ValueError:
        raise ConfigFileError(f"{where}: {key} must be HH:MM") from None


def _day(value, where: str, key: str) -> date | None:
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except (TypeError, ValueError):
        raise ConfigFileError(f"{where}: {key} must be YYYY-MM-DD") from None


def parse_windows(text: str) -> list[PauseWindow]:
    document = _load(text, "pause-windows file")
    entries = document.get("windows")
    if not isinstance(entries, list):
        raise ConfigFileError("pause-windows file: `windows` must be a list")
    windows = []
    for index, entry in enumerate(entries):
        where = f"window at index {index}"
        if not isinstance(entry, dict):
            raise ConfigFileError(f"{where} is not an object")
        unknown = set(entry) - WINDOW_KEYS
        if unknown:
            raise ConfigFileError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        window = PauseWindow(
            scope=entry.get("scope"), starts=_clock(entry.get("from"), where, "from"),
            ends=_clock(entry.get("to"), where, "to"), tz=entry.get("tz", "UTC"), days=entry.get("days", []),
            date_from=_day(entry.get("dateFrom"), where, "dateFrom"),
            date_to=_day(entry.get("dateTo"), where, "dateTo"),
        )
        try:
            window.full_clean()
        except ValidationError as exc:
            raise ConfigFileError(f"{where}: {_errors(exc)}") from None
        windows.append(window)
    return windows


def import_windows(text: str) -> int:
    windows = parse_windows(text)
    with transaction.atomic():
        PauseWindow.objects.all().delete()
        PauseWindow.objects.bulk_create(windows)
    return len(windows)


def export_windows() -> str:
    entries = []
    for window in PauseWindow.objects.filter(enabled=True).order_by("scope", "starts"):
        entry = {"scope": window.scope, "from": f"{window.starts:%H:%M}", "to": f"{window.ends:%H:%M}",
                 "tz": window.tz}
        if window.days:
            entry["days"] = window.days
        if window.date_from:
            entry["dateFrom"] = window.date_from.isoformat()
        if window.date_to:
            entry["dateTo"] = window.date_to.isoformat()
        entries.append(entry)
    return json.dumps({"windows": entries}, indent=2) + "\n"
