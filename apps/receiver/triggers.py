"""Trigger state changes, one home each: import and export of `triggers.json`, and one-shot arming.

A one-shot close rule (`on.once` with `on.number`) fires once: after the run record of its job exists the
rule is disarmed (`on.disarmed {at, jobId}`) and matches nothing until an operator re-arms it, which
stamps a new `armed_at`. A job queued before that re-arming cannot spend the new arming.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from apps.worker import known_models

from . import triggerfile
from .models import Trigger
from .validation import entry_from_trigger, fields_from_entry, parse_instant

logger = logging.getLogger("pidispatch.receiver")


# --- rules that never fire ----------------------------------------------------------------------------------

def _match_signature(rule: Trigger) -> tuple:
    """What decides which deliveries a forge rule matches (apps/receiver/matching.py). A forge reads only its first
    comment rule, so every comment rule of a forge has one signature."""
    if rule.on_type == "comment":
        return (rule.kind, "comment")
    lists = (rule.label_any, rule.label_all, rule.label_none, rule.actions, rule.review_states)
    return (rule.kind, rule.on_type, rule.number, *(tuple(sorted(value or ())) for value in lists))


def never_firing(rules=None) -> list[tuple[Trigger, Trigger]]:
    """Each enabled forge rule that can never fire because an earlier one (in matching order: position, then id)
    matches the same deliveries first, with that earlier rule. Said at save, on the list and by doctor."""
    rules = list(Trigger.objects.forge_rules()) if rules is None else rules
    first: dict[tuple, Trigger] = {}
    shadowed = []
    for rule in rules:
        earlier = first.setdefault(_match_signature(rule), rule)
        if earlier is not rule:
            shadowed.append((rule, earlier))
    return shadowed


def never_fires_sentence(rule: Trigger, earlier: Trigger) -> str:
    what = "a forge reads only its first comment trigger" if rule.on_type == "comment" else "it has the same match"
    return (f"trigger “{rule}” (position {rule.position}) never fires: “{earlier}” (position {earlier.position}) "
            f"comes first in the matching order and {what}. Give it an earlier position, or a different match.")


def unpriced_models(rules=None) -> list[tuple[Trigger, str]]:
    """Each enabled rule that names a model no price list knows (saved while PI_ALLOW_UNKNOWN_MODELS was on), with
    the sentence that says so: its runs' cost is unknown. Said at save, on the list and by doctor."""
    rules = Trigger.objects.filter(enabled=True).exclude(model="") if rules is None else rules
    found = []
    for rule in rules:
        sentence = known_models.warning(rule.provider or settings.PI_PROVIDER, rule.model)
        if sentence:
            found.append((rule, sentence))
    return found


# --- skills folders ------------------------------------------------------------------------------------------

SKILLS_DIR_PERMISSION = "receiver.set_skills_dir"


def may_set_skills_dir(user) -> bool:
    return bool(user and user.is_active and user.has_perm(SKILLS_DIR_PERMISSION))


def check_skills_dir_change(by, before: str, after: str) -> None:
    """A skills folder is a host folder copied into every job of its trigger, so pointing a trigger at one (or at
    another one) needs a permission of its own beside managing triggers; clearing it narrows what jobs get and
    needs none. `by` None: a command on the host, whose operator has the host already. PermissionDenied."""
    if by is not None and after and after != before and not may_set_skills_dir(by):
        raise PermissionDenied(f"setting run.skillsDir needs the permission {SKILLS_DIR_PERMISSION}")


# --- one-shots ----------------------------------------------------------------------------------------------

def disarm_spent(spec) -> bool:
    """Mark the one-shot rule that `spec` ran for as spent (a failed run spends it too)."""
    if not getattr(spec, "once", False) or not spec.trigger_id:
        return False
    rule = Trigger.objects.filter(pk=spec.trigger_id, once=True, disarmed_at__isnull=True)
    armed_at = parse_instant(spec.once_armed_at) if spec.once_armed_at else None
    if armed_at is not None:
        rule = rule.filter(armed_at=armed_at)
    now = timezone.now()
    disarmed = rule.update(disarmed_at=now, disarmed_job_id=spec.job_id, updated_at=now)
    if disarmed:
        logger.info("trigger_disarmed trigger=%s job=%s", spec.trigger_id, spec.job_id)
    return bool(disarmed)


def on_run_recorded(sender, run, spec, **kwargs) -> None:
    """`apps.worker.records.run_recorded` receiver."""
    disarm_spent(spec)


def rearm(triggers) -> int:
    """Clear the disarm mark of spent one-shot rules; returns how many were re-armed."""
    now = timezone.now()
    rearmed = triggers.filter(once=True, disarmed_at__isnull=False).update(
        disarmed_at=None, disarmed_job_id="", armed_at=now, updated_at=now)
    if rearmed:
        logger.info("triggers_rearmed count=%s", rearmed)
    return rearmed


def set_enabled(triggers, enabled: bool) -> int:
    return triggers.update(enabled=enabled, updated_at=timezone.now())


# --- import / export -------------------------------------------------------------------------------------

@dataclass
class ImportReport:
    created: int = 0
    updated: int = 0
    removed: int = 0
    rearmed: list[int] = field(default_factory=list)  # indexes whose disarm mark the file cleared
    warnings: list[str] = field(default_factory=list)


def _armed_at(row: Trigger, values: dict, now):
    if not values["once"]:
        return None
    still_the_same_arming = (row.pk is not None and row.once and row.armed_at is not None
                             and row.number == values["number"]
                             and (row.disarmed_at is None) == (values["disarmed_at"] is None))
    if still_the_same_arming or (row.pk is not None and row.armed_at and values["disarmed_at"] is not None):
        return row.armed_at
    return now


def check_import(parsed: triggerfile.ParsedFile, by, existing: list[Trigger] | None = None) -> None:
    """PermissionDenied when the file would set a skills folder `by` may not (the i-th rule replaces the i-th)."""
    if existing is None:
        existing = list(Trigger.objects.matching_order())
    for index, entry in enumerate(parsed.entries):
        before = existing[index].skills_dir if index < len(existing) else ""
        check_skills_dir_change(by, before, fields_from_entry(entry)["skills_dir"])


@transaction.atomic
def import_file(parsed: triggerfile.ParsedFile, by=None) -> ImportReport:
    """Make the trigger table equal the file. The i-th rule of the file updates the i-th rule in matching
    order (positions are identities: run history keeps pointing at the same rows); extra rows are removed.
    `by`: the user importing (None: a command on the host); PermissionDenied, nothing changed, when the file
    sets a skills folder the user may not."""
    report = ImportReport(warnings=list(parsed.warnings))
    existing = list(Trigger.objects.select_for_update().matching_order())
    check_import(parsed, by, existing)
    now = timezone.now()
    for index, entry in enumerate(parsed.entries):
        values = fields_from_entry(entry)
        row = existing[index] if index < len(existing) else Trigger()
        if row.pk is not None and row.disarmed and values["once"] and values["disarmed_at"] is None:
            report.rearmed.append(index)
        values["armed_at"] = _armed_at(row, values, now)
        for name, value in values.items():
            setattr(row, name, value)
        row.position = index
        row.name = entry.get("name", "")
        row.enabled = entry.get("enabled", True)
        row.note = entry.get("note", "")
        if row.pk is None:
            report.created += 1
        else:
            report.updated += 1
        row.save()
    leftovers = [row.pk for row in existing[len(parsed.entries):]]
    if leftovers:
        report.removed = Trigger.objects.filter(pk__in=leftovers).delete()[0]
    logger.info("triggers_imported created=%s updated=%s removed=%s", report.created, report.updated, report.removed)
    return report


def export_entries() -> list[dict]:
    """Every rule in matching order, in the file's form."""
    entries = []
    for trigger in Trigger.objects.matching_order():
        entry = entry_from_trigger(trigger)
        if trigger.name:
            entry["name"] = trigger.name
        if not trigger.enabled:
            entry["enabled"] = False
        if trigger.note:
            entry["note"] = trigger.note
        entries.append(entry)
    return entries
