"""The ancestor's `triggers.json` file: parse (all or nothing, every problem named) and write.

    {"triggers": [{"on": {...}, "run": {...}}, ...]}

The 0-based position in the array is a rule's identity (run history refers to it), cron entries
included. pidispatch adds three optional per-entry keys the ancestor ignores: `"name": "..."`,
`"enabled": false` and `"note": "..."`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.conf import settings

from apps.worker import known_models
from pidispatch_site import strict_json

from .validation import collection_problems, entry_problems

ENTRY_KEYS = {"on", "run", "name", "enabled", "note"}
MAX_NAME = 100
MAX_NOTE = 200


class TriggerFileError(Exception):
    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class ParsedFile:
    entries: list[dict]
    warnings: list[str] = field(default_factory=list)


def parse(text: str | bytes) -> ParsedFile:
    """Validate a whole file; raise TriggerFileError listing every problem (then nothing may change)."""
    try:
        document = strict_json.loads(text)
    except strict_json.DuplicateKeyError as duplicate:
        raise TriggerFileError([f"the file repeats the key {duplicate.key!r} inside one object; JSON keeps "
                                "only the last value, so remove the other."]) from None
    except (ValueError, RecursionError) as error:
        raise TriggerFileError([f"the file is not valid JSON: {error}"]) from None
    if not isinstance(document, dict) or not isinstance(document.get("triggers"), list):
        raise TriggerFileError(['the file must be an object with a "triggers" array: {"triggers": [...]}'])

    problems, warnings = [], []
    entries = document["triggers"]
    for index, entry in enumerate(entries):
        where = f"trigger at index {index}"
        entry_errors, dropped = entry_problems(entry)
        problems.extend(f"{where}: {problem.message}" for problem in entry_errors)
        warnings.extend(f"{where}: {path} is not a trigger field and is ignored" for path in dropped)
        if isinstance(entry, dict):
            problems.extend(f"{where}: {message}" for message in _extension_problems(entry))
            warnings.extend(f"{where}: {key} is not a trigger field and is ignored"
                            for key in entry if key not in ENTRY_KEYS)
            if not entry_errors and (unpriced := _unpriced_model(entry.get("run") or {})):
                warnings.append(f"{where}: run.model: {unpriced}")
    problems.extend(f"trigger at index {index}: {problem.message}" for index, problem in collection_problems(entries))
    if problems:
        raise TriggerFileError(problems)
    return ParsedFile(entries=entries, warnings=warnings)


def _unpriced_model(run: dict) -> str | None:
    """A model PI_ALLOW_UNKNOWN_MODELS let through (validation refuses it otherwise): its cost will be unknown."""
    model = run.get("model")
    return known_models.warning(run.get("provider") or settings.PI_PROVIDER, model) if isinstance(model, str) else None


def _extension_problems(entry: dict) -> list[str]:
    found = []
    if "enabled" in entry and not isinstance(entry["enabled"], bool):
        found.append("enabled must be true or false.")
    if "name" in entry and (not isinstance(entry["name"], str) or len(entry["name"]) > MAX_NAME):
        found.append(f"name must be text of at most {MAX_NAME} characters.")
    if "note" in entry and (not isinstance(entry["note"], str) or len(entry["note"]) > MAX_NOTE):
        found.append(f"note must be text of at most {MAX_NOTE} characters.")
    return found


def render(entries: list[dict]) -> str:
    return json.dumps({"triggers": entries}, indent=2, ensure_ascii=False) + "\n"
