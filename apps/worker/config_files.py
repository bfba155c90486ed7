"""The ancestor's `scoped-limits.json` and pause-windows JSON files, in and out of the database.

An import is all or nothing: every entry is validated first (with the same rules as the admin), and a
file with any bad entry changes nothing and names the entry, the field and the rule.
"""

from __future__ import annotations

import json
from datetime import date, time

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.worker.gates.money import MoneyError, parse_usd, to_usd
from apps.worker.models import PauseWindow, ScopedLimit
from pidispatch_site import strict_json

# Version 2 adds the dollar windows (`dayUsd`, `weekUsd`, `monthUsd`: decimal strings, a JSON number also read);
# an export writes the lowest version that holds its rows. Version 3's project rows are not supported.
LIMITS_VERSION = 2
LIMIT_FIELDS = ("day", "week", "month", "concurrent")
DOLLAR_KEYS = {"dayUsd": "day_usd", "weekUsd": "week_usd", "monthUsd": "month_usd"}
WINDOW_KEYS = {"scope", "from", "to", "tz", "days", "dateFrom", "dateTo"}


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

def parse_limits(text: str) -> list[ScopedLimit]:
    document = _load(text, "scoped-limits file")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigFileError("scoped-limits file: `version` must be an integer >= 1")
    if version > LIMITS_VERSION:
        raise ConfigFileError(f"scoped-limits file version {version} is newer than this build understands "
                              f"({LIMITS_VERSION}); project rows are not supported")
    rows = document.get("limits")
    if not isinstance(rows, list):
        raise ConfigFileError("scoped-limits file: `limits` must be a list")
    limits, seen = [], set()
    for index, row in enumerate(rows):
        where = f"limit at index {index}"
        if not isinstance(row, dict):
            raise ConfigFileError(f"{where} is not an object")
        known = {"scope", *LIMIT_FIELDS, *(DOLLAR_KEYS if version >= 2 else ())}
        unknown = set(row) - known
        if unknown:
            key = sorted(unknown)[0]
            why = " (dollar windows need version 2)" if key in DOLLAR_KEYS else ""
            raise ConfigFileError(f"{where}: unknown key {key!r}{why}")
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
        limit = ScopedLimit(scope=row.get("scope"), **values)
        try:
            limit.full_clean(validate_unique=False)
        except ValidationError as exc:
            raise ConfigFileError(f"{where}: {_errors(exc)}") from None
        if limit.scope in seen:
            raise ConfigFileError(f"{where}: scope {limit.scope!r} is listed twice")
        seen.add(limit.scope)
        limits.append(limit)
    return limits


def import_limits(text: str) -> int:
    limits = parse_limits(text)
    with transaction.atomic():
        ScopedLimit.objects.all().delete()
        ScopedLimit.objects.bulk_create(limits)
    return len(limits)


def export_limits() -> str:
    rows, version = [], 1
    for limit in ScopedLimit.objects.order_by("scope"):
        row = {"scope": limit.scope}
        row.update({name: getattr(limit, name) for name in LIMIT_FIELDS if getattr(limit, name) is not None})
        for key, name in DOLLAR_KEYS.items():
            if getattr(limit, name) is not None:
                row[key] = _usd_text(getattr(limit, name))
                version = 2
        rows.append(row)
    return json.dumps({"version": version, "limits": rows}, indent=2) + "\n"


def _usd_text(amount) -> str:
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


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
            date_from=_day(entry.get("dateFrom"), where, "dateFrom"), date_to=_day(entry.get("dateTo"), where, "dateTo"),
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
