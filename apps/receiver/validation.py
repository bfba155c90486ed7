"""Validation of trigger rules: one module for the admin form, the API and the importer.

Every error names the field (in the ancestor's `on.*` / `run.*` spelling) and the rule it broke.
"""

import re

from django.core.exceptions import ValidationError

FLOW_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?$")
FORGE_KINDS = {"github", "gitlab", "forgejo", "azure"}
LABEL_FIELDS = {"label_any": "on.any", "label_all": "on.all", "label_none": "on.none"}


def _label_list_errors(value, name: str) -> list[str]:
    if not isinstance(value, list):
        return [f"{name} must be a list of label names."]
    if any(not isinstance(item, str) or not item.strip() for item in value):
        return [f"{name} must hold non-empty label names (strings)."]
    if len(set(value)) != len(value):
        return [f"{name} lists a label twice."]
    return []


def validate_trigger_fields(trigger) -> None:
    errors: dict[str, list[str]] = {}

    if trigger.kind not in FORGE_KINDS:
        errors.setdefault("kind", []).append(
            f"run.kind must be one of {', '.join(sorted(FORGE_KINDS))} for a {trigger.on_type} trigger."
        )

    if trigger.on_type == "label":
        for field, name in LABEL_FIELDS.items():
            problems = _label_list_errors(getattr(trigger, field), name)
            if problems:
                errors.setdefault(field, []).extend(problems)
        if "label_any" not in errors and "label_all" not in errors and not (trigger.label_any or trigger.label_all):
            errors.setdefault("label_any", []).append(
                "A label trigger needs at least one positive selector: on.any or on.all must name a label "
                "(on.none alone can only suppress, never fire)."
            )

    if not FLOW_PATTERN.fullmatch(trigger.flow or ""):
        errors.setdefault("flow", []).append(
            "run.flow must be 1-64 lowercase letters, digits, '-' or '_', starting and ending with a letter or digit."
        )

    if errors:
        raise ValidationError(errors)
