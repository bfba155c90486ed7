"""The admin's trigger form: one trigger type at a time, in words a person uses, lists as comma-separated text.

Only the presentation lives here. What a valid rule is stays in validation.py (the API and the importer use
it too): the form turns text into the model's values, the model's clean() validates them, and the messages
are shown beside the field they are about, with the file's paths (`on.any`) replaced by the form's labels.
"""

from __future__ import annotations

import json
import re

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.utils.html import conditional_escape

from . import run_keys
from .models import Trigger, TriggerType
from .validation import FIELD_PATHS, FORGE_KINDS, PR_ACTIONS, REVIEW_STATES

# type: (what a person calls it, when it fires)
TYPES = {
    "label": ("Label", "An issue or pull/merge request gets a label (e.g. pi), on every forge: the most common "
                       "trigger. GitHub and Forgejo read all its labels when it is labelled, opened or reopened; "
                       "GitLab and Azure DevOps the labels just added (Azure: a pull request created with them)."),
    "comment": ("Comment", "Someone with write access comments a phrase (e.g. @pi) on an issue or pull request."),
    "pull_request": ("Pull request", "A pull/merge request is opened, updated, reviewed or closed (for a label "
                                     "alone, a Label trigger is enough)."),
    "issue": ("Issue closed", "An issue is closed (or one particular issue, once)."),
    "cron": ("Schedule", "On a timetable, in a folder on a worker host (no forge involved)."),
}

FIRES = {
    "cron": ("cron_id", "cron_pattern"),
    "label": ("label_any", "label_all", "label_none"),
    "comment": ("phrase",),
    "pull_request": ("actions", "label_any", "label_all", "label_none", "review_states", "number", "once"),
    "issue": ("actions", "number", "once"),
}


def _run_side(form: str) -> dict[str, tuple[str, ...]]:
    """The run keys of one part of the form, for a schedule and for a forge rule, in the declaration's order."""
    return {side: tuple(key.field for key in run_keys.RUN_KEYS if key.form == form and family in key.triggers)
            for side, family in (("cron", run_keys.CRON), ("forge", run_keys.FORGE))}


RUNS = _run_side("runs")
LIMITS = _run_side("limits")

# Kept as they are when not on the form.
NEVER_RESET = {"name", "position", "enabled", "note", "on_type"}

_ACTIONS = "; ".join(f"{forge}: {', '.join(words)}" for forge, words in PR_ACTIONS.items())

# field: (label, help text with an example)
WORDS = {
    "name": ("Name", "What you call it, e.g. Fix labelled bugs: the trigger list and its runs show it. Empty: "
                     "its type and order."),
    "position": ("Order", "Rules are tried from the lowest number up; the first that matches runs. e.g. 10"),
    "note": ("Note", "For the other operators; the agent never sees it."),
    "cron_id": ("Schedule name", "Unique among schedules, e.g. nightly-deps"),
    "cron_pattern": ("When", "Cron: minute hour day month weekday, in PI_CRON_TZ (default UTC). "
                             "e.g. 0 6 * * 1-5 is 06:00 on weekdays"),
    "label_any": ("Labels, any of", "Fires when the item carries at least one of these. e.g. pi, urgent"),
    "label_all": ("Labels, all of", "Fires only when the item carries every one of these. e.g. pi, backend"),
    "label_none": ("Labels, none of", "Never fires while the item carries any of these. e.g. wontfix, blocked"),
    "phrase": ("Comment contains", "e.g. @pi. A comment “@pi fix-bug” runs the flow fix-bug instead of this one."),
    "actions": ("Forge actions", f"The forge's own words for what happened, comma-separated. e.g. opened, "
                                 f"reopened. {_ACTIONS}. Issue closed: closed (GitLab: close)."),
    "review_states": ("Review verdicts", f"GitHub, with the action review_submitted: {', '.join(REVIEW_STATES)}. "
                                         "Empty: every verdict. e.g. changes_requested"),
    "number": ("Only this number", "Watch one issue or pull request, e.g. 42. Empty: every one."),
    "once": ("Fire once", "With a number: run once, then disarm (re-arm it from the trigger list)."),
    # Each run key's words are its declaration's (run_keys.py).
    **{key.field: (key.label, key.help) for key in run_keys.RUN_KEYS},
}
EXAMPLES = {"label_any": "pi, urgent", "label_all": "pi, backend", "label_none": "wontfix, blocked",
            "actions": "opened, reopened", "review_states": "approved, changes_requested",
            **{key.field: key.example for key in run_keys.RUN_KEYS if key.example}}


def _split(text: str) -> list[str]:
    return [part.strip() for part in re.split(r"[,\n]", text) if part.strip()]


class TextListField(forms.CharField):
    """A list as comma-separated text (a JSON list is read too); shown back as comma-separated text."""

    def __init__(self, *, example: str, **kwargs):
        self.example = example
        super().__init__(required=False, widget=forms.TextInput(attrs={"class": "vTextField"}), **kwargs)

    def prepare_value(self, value):
        if isinstance(value, list):
            return ", ".join(self.show(item) for item in value)
        return value

    def show(self, item) -> str:
        return str(item)

    def to_python(self, value):
        value = (value or "").strip()
        if value.startswith("["):
            try:
                parsed = json.loads(value)
            except ValueError:
                raise ValidationError(self.wrong(), code="invalid") from None
            if not isinstance(parsed, list):
                raise ValidationError(self.wrong(), code="invalid")
            return parsed
        return [self.item(part) for part in _split(value)]

    def item(self, text: str):
        return text

    def wrong(self) -> str:
        return f"{self.label}: write the values separated by commas, e.g. {self.example}"


class WaitForField(TextListField):
    """`after 2026-12-01T09:00:00Z, profile ci-green`, or the trigger file's JSON list."""

    def show(self, item) -> str:
        if isinstance(item, dict) and len(item) == 1:
            (key, value), = item.items()
            return f"{key} {value}"
        return json.dumps(item)

    def item(self, text: str):
        key, _, value = text.partition(" ")
        if key not in ("after", "profile") or not value.strip():
            raise ValidationError(self.wrong(), code="invalid")
        return {key: value.strip()}

    def wrong(self) -> str:
        return f"{self.label}: each condition is “after <time with zone>” or “profile <name>”, e.g. {self.example}"


class SecretsField(forms.CharField):
    """`NPM_TOKEN=npm/ci, PYPI=pypi/upload`, or the trigger file's JSON object."""

    def __init__(self, **kwargs):
        super().__init__(required=False, widget=forms.TextInput(attrs={"class": "vTextField"}), **kwargs)

    def prepare_value(self, value):
        if isinstance(value, dict):
            return ", ".join(f"{name}={reference}" for name, reference in value.items())
        return value

    def to_python(self, value):
        value = (value or "").strip()
        if value.startswith("{"):
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise ValidationError(self.wrong(), code="invalid")
            return parsed
        pairs = {}
        for part in _split(value):
            name, sep, reference = part.partition("=")
            if not sep or not name.strip():
                raise ValidationError(self.wrong(), code="invalid")
            pairs[name.strip()] = reference.strip()
        return pairs

    def wrong(self) -> str:
        return f"{self.label}: write NAME=reference pairs separated by commas, e.g. {EXAMPLES['secrets']}"


def chosen_type(value) -> str:
    return value if value in TYPES else ""


def fieldsets_for(on_type: str, instance=None) -> tuple:
    run_side = "cron" if on_type == "cron" else "forge"
    fires = FIRES[on_type] + (("one_shot_state",) if on_type in ("issue", "pull_request") else ())
    return (
        (None, {"fields": ("type_display", "on_type", "name", "enabled", "position", "note")}),
        ("What fires it", {"fields": fires}),
        ("What runs", {"fields": RUNS[run_side]}),
        ("Limits and extras", {"fields": LIMITS[run_side], "classes": ("collapse",) if not _extras_set(
            instance, LIMITS[run_side]) else ()}),
    )


def _extras_set(instance, names) -> bool:
    if instance is None or instance.pk is None:
        return False
    defaults = {name: Trigger._meta.get_field(name).get_default() for name in names}
    return any(getattr(instance, name) not in (defaults[name], None, "", [], {}) for name in names)


class TriggerForm(forms.ModelForm):
    chosen_type = ""  # set by the admin for the type being edited
    may_set_skills_dir = False  # set by the admin: the user's permission to set run.skillsDir

    class Meta:
        model = Trigger
        fields = "__all__"
        widgets = {"on_type": forms.HiddenInput}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        on_type = self.chosen_type or self.instance.on_type or TriggerType.LABEL
        if not self.is_bound:
            self.initial["on_type"] = on_type
            self.instance.on_type = on_type  # what the page's "Trigger type" line reads
        for name, field in list(self.fields.items()):
            label, help_text = WORDS.get(name, (field.label, field.help_text))
            if name == "wait_for":
                field = WaitForField(example=EXAMPLES[name])
            elif name in ("label_any", "label_all", "label_none", "actions", "review_states") or (
                    name in run_keys.BY_FIELD and run_keys.BY_FIELD[name].shape is run_keys.LIST):
                field = TextListField(example=EXAMPLES[name])
            elif name in run_keys.BY_FIELD and run_keys.BY_FIELD[name].shape is run_keys.OBJECT:
                field = SecretsField()
            # Escaped: the admin marks help texts safe, and `<time with zone>` would vanish as a tag.
            field.label, field.help_text = label, conditional_escape(help_text)
            self.fields[name] = field
        if "kind" in self.fields:
            if on_type == "cron":
                self.fields["kind"].choices = [("local", "local folder on a worker host")]
                self.fields["kind"].widget = forms.HiddenInput()
                self.initial.setdefault("kind", "local")
                if not self.is_bound:
                    self.initial["kind"] = "local"
            else:
                forges = [kind for kind in FORGE_KINDS if not (on_type == "issue" and kind == "azure")]
                labels = dict(Trigger._meta.get_field("kind").choices)
                self.fields["kind"].choices = [(kind, labels[kind]) for kind in forges]
        for name in ("task", "instructions"):
            if name in self.fields:
                self.fields[name].widget.attrs.update(rows=3)
        if "skills_dir" in self.fields and not self.may_set_skills_dir:
            # Shown as it is, never taken from the post: a skills folder is a permission of its own.
            self.fields["skills_dir"].disabled = True
            self.fields["skills_dir"].help_text += " (Setting it needs the permission receiver.set_skills_dir.)"

    def _post_clean(self):
        # Fields of another type are not on the form: clear them, so a rule changed from one type to another
        # keeps nothing the new type would refuse (validation names every key a type does not use).
        for field in Trigger._meta.get_fields():
            name = getattr(field, "attname", None) and field.name
            if (name and getattr(field, "editable", False) and not field.primary_key and name not in self.fields
                    and name not in NEVER_RESET and not field.is_relation):
                setattr(self.instance, name, field.get_default())
        super()._post_clean()

    def _update_errors(self, errors):
        # The rule's messages speak the file's language (`on.any`); here each is said with the form's label,
        # beside its field. A field that already failed to parse keeps only that one error, and a field the
        # form does not show sends its message to the top.
        if hasattr(errors, "error_dict"):
            placed: dict = {}
            for field, messages_ in errors.error_dict.items():
                if field in self._errors:
                    continue  # one error per mistake: its text could not be read, say only that
                target = field if field in self.fields else NON_FIELD_ERRORS
                for message in messages_:
                    for text in message.messages if hasattr(message, "messages") else [message]:
                        text = self.in_form_words(str(text))
                        if text not in placed.get(target, []):
                            placed.setdefault(target, []).append(text)
            if not placed:
                return
            errors = ValidationError(placed)
        super()._update_errors(errors)

    def in_form_words(self, text: str) -> str:
        for path in sorted(FIELD_PATHS, key=len, reverse=True):
            name = FIELD_PATHS[path]
            if path in text:
                label = self.fields[name].label if name in self.fields else WORDS.get(name, (path,))[0]
                text = re.sub(rf"{re.escape(path)}\b", f"“{label}”", text)
        text = re.sub(r"”(?:/(?:all|none))+\b", "” (or the other label lists)", text)
        return text[0].upper() + text[1:] if text else text
