"""The trigger language (the ancestor's `triggers.json`) and its validation: one module for the admin
form, the API and the importer.

A rule is checked in its file form, `{"on": {...}, "run": {...}}`, whatever it came from: the importer
passes the raw entry, the model converts itself with `entry_from_trigger`. Every error names the field in
the file's spelling (`run.flow`, `on.action`) and the rule it broke. Keys that would silently do nothing
(near-misses of real keys, keys of another trigger type, ancestor keys pidispatch does not implement) are
refused; other unknown keys are dropped with a warning, as the ancestor does.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime

from croniter import croniter
from django.core.exceptions import ValidationError

from apps import forge_registry

from . import run_keys
from .run_keys import Rule, parse_instant, trimmed_nonempty

# --- vocabulary ------------------------------------------------------------------------------------------

TRIGGER_TYPES = ("cron", "label", "comment", "pull_request", "issue")
FORGE_KINDS = forge_registry.NAMES
RUN_KINDS = ("local", *FORGE_KINDS)

PR_ACTIONS = {forge.name: forge.pr_actions for forge in forge_registry.FORGES}
CLOSE_WORDS = {forge.name: forge.close_word for forge in forge_registry.FORGES if forge.close_word}
PR_LABEL_ACTIONS = {forge.name: forge.pr_label_action for forge in forge_registry.FORGES if forge.pr_label_action}
REVIEW_ACTION = "review_submitted"
REVIEW_STATES = ("approved", "changes_requested", "commented")

CRON_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_PHRASE = 100

# --- which keys exist where -------------------------------------------------------------------------------

# `on`'s keys and the Trigger fields that store them (the run keys are run_keys.py's).
ON_FIELDS = {"type": "on_type", "id": "cron_id", "pattern": "cron_pattern", "any": "label_any", "all": "label_all",
             "none": "label_none", "phrase": "phrase", "action": "actions", "reviewState": "review_states",
             "number": "number", "once": "once", "disarmed": "disarmed_at"}
ON_KEYS = tuple(ON_FIELDS)
RUN_KEYS = tuple(run_keys.BY_NAME)
ON_KEYS_BY_TYPE = {
    "cron": {"type", "id", "pattern"},
    "label": {"type", "any", "all", "none"},
    "comment": {"type", "phrase"},
    "pull_request": {"type", "action", "any", "all", "none", "reviewState", "number", "once", "disarmed"},
    "issue": {"type", "action", "number", "once", "disarmed"},
}
# Part of the ancestor's language, not implemented here: refused rather than silently ignored.
UNSUPPORTED_RUN_KEYS = ("portfolio",)
# Of those, the ones whose feature is planned: the refusal names it.
NOT_BUILT_YET_RUN_KEYS = {
    "portfolio": "portfolio jobs (a run that plans the envelope's allocation across projects) are not built yet",
}
NEAR_MISS_SUGGESTIONS = {
    "providerid": "run.provider", "providers": "run.provider", "modelid": "run.model", "modelname": "run.model",
    "maxturn": "run.maxTurns", "allowedmodels": "run.models", "maxcost": "run.maxCostUsd", "backends": "run.backend",
    "excludetool": "run.excludeTools", "excludedtools": "run.excludeTools", "tools": "run.excludeTools",
    "notools": "run.excludeTools", "secretprofile": "run.secretsProfile", "secret": "run.secrets",
    "replica": "run.replicas", "repo": "run.repository", "reviewstates": "on.reviewState", "actions": "on.action",
    "labels": "on.any", "phrases": "on.phrase", "cron": "on.pattern", "schedule": "on.pattern",
}

# Each path of the file (`run.flow`) and the Trigger field it is stored in: the admin shows a problem beside it.
FIELD_PATHS = {**{f"on.{key}": field for key, field in ON_FIELDS.items()},
               **{key.path: key.field for key in run_keys.RUN_KEYS}}


@dataclass(frozen=True)
class RuleProblem:
    path: str  # `run.flow`, `on.action`, or `on`/`run`/`` for the whole object
    message: str

    def __str__(self):
        return self.message


def _normalised_key(key: str) -> str:
    folded = unicodedata.normalize("NFKC", key).casefold()
    return re.sub(r"[\s_.\-]", "", folded)


_KNOWN_BY_NORMAL = {_normalised_key(key): key for key in (*RUN_KEYS, *UNSUPPORTED_RUN_KEYS)}
_ON_KNOWN_BY_NORMAL = {_normalised_key(key): key for key in ON_KEYS}


def key_problems(section: dict, where: str) -> tuple[list[RuleProblem], list[str]]:
    """Near-misses and unsupported keys (errors), and unknown keys that are dropped (warnings)."""
    problems, dropped = [], []
    known = ON_KEYS if where == "on" else RUN_KEYS
    known_by_normal = _ON_KNOWN_BY_NORMAL if where == "on" else _KNOWN_BY_NORMAL
    for key in section:
        if not isinstance(key, str):
            continue
        if key in known:
            continue
        path = f"{where}.{key}"
        normal = _normalised_key(key)
        spelled_like = known_by_normal.get(normal)
        suggestion = f"{where}.{spelled_like}" if spelled_like else NEAR_MISS_SUGGESTIONS.get(normal)
        unsupported = where == "run" and (key in UNSUPPORTED_RUN_KEYS or (suggestion or "")[4:] in UNSUPPORTED_RUN_KEYS)
        if where == "on" and normal == "waitfor":
            problems.append(RuleProblem(path, f"{path}: waitFor belongs under run (run.waitFor), not under on."))
        elif where == "run" and key in NOT_BUILT_YET_RUN_KEYS:
            problems.append(RuleProblem(path, f"{path}: {NOT_BUILT_YET_RUN_KEYS[key]}; remove it."))
        elif unsupported:
            problems.append(RuleProblem(path, (
                f"{path} is part of the ancestor's trigger language ({suggestion or path}) but pidispatch does not "
                "implement it; remove it (ignoring it would run this rule differently than written).")))
        elif spelled_like:
            problems.append(RuleProblem(path, (
                f"{path} looks like {suggestion}; spell it exactly (a misspelt key would silently do nothing).")))
        elif suggestion:
            problems.append(RuleProblem(path, (
                f"{path} is not a trigger field; did you mean {suggestion}? (a key that is not understood would "
                "silently do nothing).")))
        else:
            dropped.append(path)
    return problems, dropped


# --- the rule -----------------------------------------------------------------------------------------------

class _Problems(list):
    def add(self, path: str, message: str) -> None:
        self.append(RuleProblem(path, message))


def entry_problems(entry) -> tuple[list[RuleProblem], list[str]]:
    """All problems of one `{"on": ..., "run": ...}` rule (errors), and the unknown keys it drops (warnings)."""
    problems = _Problems()
    if not isinstance(entry, dict):
        problems.add("", "a trigger must be an object with `on` and `run`.")
        return problems, []
    on, run = entry.get("on"), entry.get("run")
    if not isinstance(on, dict):
        problems.add("on", "on must be an object (what fires the trigger).")
    if not isinstance(run, dict):
        problems.add("run", "run must be an object (what the job does).")
    if problems:
        return problems, []

    dropped: list[str] = []
    for section, where in ((on, "on"), (run, "run")):
        section_problems, section_dropped = key_problems(section, where)
        problems.extend(section_problems)
        dropped.extend(section_dropped)

    on_type, kind = on.get("type"), run.get("kind")
    if on_type not in TRIGGER_TYPES:
        problems.add("on.type", f"on.type must be one of {', '.join(TRIGGER_TYPES)}.")
    if kind not in RUN_KINDS:
        problems.add("run.kind", f"run.kind must be one of {', '.join(RUN_KINDS)}.")
    if on_type not in TRIGGER_TYPES or kind not in RUN_KINDS:
        return problems, dropped

    if on_type == "cron" and kind != "local":
        problems.add("run.kind", 'a cron trigger runs in a folder on a worker host: run.kind must be "local".')
    elif on_type != "cron" and kind == "local":
        problems.add("run.kind", f"a {on_type} trigger is fired by a forge: run.kind must be one of "
                                 f"{', '.join(FORGE_KINDS)}.")

    for key in on:
        if key in ON_KEYS and key not in ON_KEYS_BY_TYPE[on_type]:
            problems.add(f"on.{key}", f"on.{key} is not used by {on_type} triggers (it would do nothing); remove it.")
    for name in run:
        key = run_keys.BY_NAME.get(name)
        if key is None or key.allowed_for(on_type):
            continue
        if on_type == "cron":
            problems.add(key.path, f"{key.path} is for forge triggers, not cron triggers.")
        else:
            problems.add(key.path,
                         f"{key.path} is only for cron triggers (a forge job works on the issue's repository).")

    _check_on(on_type, kind, on, run, problems)
    _check_run(on_type, kind, on, run, problems)
    return problems, dropped


def close_word_in(actions, kind: str) -> bool:
    return isinstance(actions, list) and CLOSE_WORDS.get(kind) in actions


def is_close_rule(on_type: str, kind: str, actions) -> bool:
    """An `issue` rule, or a `pull_request` rule whose only action is the forge's close word."""
    return on_type == "issue" or (on_type == "pull_request" and close_word_in(actions, kind))


def _check_predicate(on: dict, problems: _Problems) -> bool:
    """Validates on.any/all/none; True when there is at least one positive selector."""
    ok = True
    for key in ("any", "all", "none"):
        if key in on:
            problem = run_keys.string_list_problem(on[key], f"on.{key}")
            if problem:
                problems.add(f"on.{key}", problem.replace("strings", "label names"))
                ok = False
    return ok and bool(on.get("any") or on.get("all"))


def _check_on(on_type, kind, on, run, problems: _Problems) -> None:
    if on_type == "cron":
        _check_schedule(on, problems)
    elif on_type == "label":
        positive = _check_predicate(on, problems)
        if not positive and not problems_for(problems, "on.any", "on.all"):
            problems.add("on.any", "A label trigger needs at least one positive selector: on.any or on.all must "
                                   "name a label (on.none alone can only suppress, never fire).")
    elif on_type == "comment":
        phrase = on.get("phrase")
        if not isinstance(phrase, str) or not phrase.strip() or len(phrase) > MAX_PHRASE:
            problems.add("on.phrase", f"on.phrase must be the non-empty text a comment must contain "
                                      f"(at most {MAX_PHRASE} characters), e.g. \"@pi\".")
    elif kind in FORGE_KINDS:
        _check_forge_actions(on_type, kind, on, problems)


def _check_schedule(on, problems: _Problems) -> None:
    cron_id, pattern = on.get("id"), on.get("pattern")
    if not isinstance(cron_id, str) or not CRON_ID_PATTERN.fullmatch(cron_id):
        problems.add("on.id", "on.id must name the cron trigger: 1-64 letters, digits, '.', '_' or '-' (no ':').")
    problem = cron_pattern_problem(pattern)
    if problem:
        problems.add("on.pattern", problem)


CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of the month", 1, 31), ("month", 1, 12),
               ("day of the week", 0, 7))


def cron_pattern_problem(pattern) -> str | None:
    """What is wrong with a cron pattern, naming the field when one is out of its range; None when it is valid."""
    example = 'e.g. "0 6 * * 1-5" (minute hour day-of-month month day-of-week; a sixth field first: seconds)'
    fields = pattern.split() if isinstance(pattern, str) else []
    if len(fields) not in (5, 6):
        return (f"on.pattern must be a cron expression of 5 or 6 space-separated fields (it has {len(fields)}), "
                f"{example}.")
    named = ((("second", 0, 59),) if len(fields) == 6 else ()) + CRON_FIELDS
    for field, (name, low, high) in zip(fields, named, strict=True):
        for number in re.findall(r"(?<![/\w])\d+", field):  # the values, not a step's divisor after `/`
            if not low <= int(number) <= high:
                return f"on.pattern's {name} field is {number}, out of its range {low}-{high}: {example}."
    if not croniter.is_valid(pattern, second_at_beginning=len(fields) == 6):
        return f"on.pattern is not a cron expression croniter reads, {example}."
    return None


def _check_forge_actions(on_type, kind, on, problems: _Problems) -> None:
    """pull_request and issue rules: on.action from the forge's own vocabulary, then what its actions allow."""
    actions = on.get("action")
    vocabulary = (PR_ACTIONS[kind] if on_type == "pull_request"
                  else ((CLOSE_WORDS[kind],) if kind in CLOSE_WORDS else ()))
    if on_type == "issue" and kind == "azure":
        problems.add("run.kind", "issue (close) triggers are not available for Azure DevOps work items.")
        return
    problem = run_keys.string_list_problem(actions, "on.action", allow_empty=False) if "action" in on else \
        "on.action is required: the list of actions that fire this rule."
    if problem:
        problems.add("on.action", f"{problem} {kind} allows: {', '.join(vocabulary)}.")
        return
    unknown = [word for word in actions if word not in vocabulary]
    if unknown:
        problems.add("on.action", f"on.action: {', '.join(map(str, unknown))} is not a {kind} "
                                  f"{'pull request' if on_type == 'pull_request' else 'issue'} action; "
                                  f"{kind} allows: {', '.join(vocabulary)}.")
        return
    close = is_close_rule(on_type, kind, actions)
    if close and len(actions) > 1:
        problems.add("on.action", f"on.action: the close word {CLOSE_WORDS[kind]!r} must be the rule's only action "
                                  "(a close rule is gated on the closer, other rules on the author or a label).")
    has_predicate = any(key in on for key in ("any", "all", "none"))
    if on_type == "issue" and has_predicate:
        problems.add("on.any", "issue (close) triggers take no label predicate (on.any/all/none).")
    if on_type == "pull_request":
        _check_pull_request_rule(kind, on, actions, close, has_predicate, problems)
    for key in ("number", "once", "disarmed"):
        if key in on and not close:
            problems.add(f"on.{key}", f"on.{key} is only for close rules (an issue rule, or a pull_request rule "
                                      "whose only action is the close word).")
    if close:
        _check_close_rule(on, problems)


def _check_pull_request_rule(kind, on, actions, close: bool, has_predicate: bool, problems: _Problems) -> None:
    if close and has_predicate:
        problems.add("on.any", "a close-only pull_request rule takes no label predicate (on.any/all/none).")
    elif kind == "azure" and has_predicate:
        problems.add("on.any", "Azure DevOps pull requests have no labels: remove on.any/all/none.")
    else:
        positive = _check_predicate(on, problems)
        label_action = PR_LABEL_ACTIONS.get(kind)
        if label_action in actions and not positive and not problems_for(problems, "on.any", "on.all"):
            problems.add("on.any", f"on.action {label_action!r} needs a positive selector: on.any or on.all "
                                   "must name the label that fires it.")
    if "reviewState" not in on:
        return
    states = on["reviewState"]
    if kind != "github":
        problems.add("on.reviewState", "on.reviewState exists only for GitHub reviews.")
    elif REVIEW_ACTION not in actions:
        problems.add("on.reviewState", f"on.reviewState needs {REVIEW_ACTION!r} in on.action.")
    else:
        problem = run_keys.string_list_problem(states, "on.reviewState", allow_empty=False)
        if problem or any(state not in REVIEW_STATES for state in states):
            problems.add("on.reviewState", f"on.reviewState must be a non-empty list drawn from "
                                           f"{', '.join(REVIEW_STATES)}.")


def _check_close_rule(on, problems: _Problems) -> None:
    number, once = on.get("number"), on.get("once")
    if "number" in on and (not run_keys.is_int(number) or number < 1):
        problems.add("on.number", "on.number must be a whole number >= 1: the issue or pull request this rule watches.")
    if "once" in on and not isinstance(once, bool):
        problems.add("on.once", "on.once must be true or false.")
    if once is True and "number" not in on:
        problems.add("on.once", "on.once needs on.number: a one-shot rule watches one item.")
    if "disarmed" in on:
        disarmed = on["disarmed"]
        if once is not True:
            problems.add("on.disarmed", "on.disarmed only exists beside on.once: true.")
        elif (not isinstance(disarmed, dict) or set(disarmed) - {"at", "jobId"}
              or parse_instant(disarmed.get("at")) is None
              or ("jobId" in disarmed and not trimmed_nonempty(disarmed.get("jobId")))):
            problems.add("on.disarmed", "on.disarmed must be {\"at\": <ISO 8601 instant with zone>, \"jobId\": "
                                        "<job id>} (delete it to re-arm the rule).")


def problems_for(problems, *paths) -> bool:
    return any(problem.path in paths for problem in problems)


def _check_run(on_type, kind, on, run, problems: _Problems) -> None:
    """Each key's own check (run_keys.RUN_KEYS), then the rules that read several keys together."""
    rule = Rule(on_type, kind, on, run)
    if ("flow" in run) == ("command" in run):
        problems.add("run.flow", "run needs exactly one of run.flow (a pi skill) or run.command (a pi extension "
                                 "command).")
    for key in run_keys.RUN_KEYS:
        if key.check is not None and key.name in run and key.allowed_for(on_type):
            for message in key.check(run[key.name], rule):
                problems.add(key.path, message)
    for check in RUN_RULES:
        for path, message in check(rule):
            problems.add(path, message)


def _cron_needs(rule: Rule):
    run = rule.run
    if rule.on_type != "cron":
        return
    if not trimmed_nonempty(run.get("folder")):
        yield "run.folder", "run.folder is required: the folder on the worker host the cron job works in."
    if "flow" in run and not (isinstance(run.get("task"), str) and run["task"].strip()):
        yield "run.task", "run.task is required beside run.flow: the cron job's prompt."
    if "command" in run and "task" in run:
        yield "run.task", "run.task cannot be combined with run.command (a command takes no prompt)."


def _a_command_takes_no_prompt(rule: Rule):
    if "instructions" in rule.run and "command" in rule.run and rule.on_type != "cron":
        yield "run.instructions", "run.instructions cannot be combined with run.command (a command takes no prompt)."


def _resume_excludes(rule: Rule):
    if rule.run.get("resume") is True:
        for other in ("replicas", "secrets", "command"):
            if other in rule.run:
                yield "run.resume", f"run.resume: true cannot be combined with run.{other}."


def _one_shot_and_waits(rule: Rule):
    run, once = rule.run, rule.on.get("once") is True
    if "replicas" in run and once:
        yield "run.replicas", "run.replicas cannot be combined with on.once (a one-shot runs once)."
    if "waitFor" in run and once:
        yield "run.waitFor", "run.waitFor cannot be combined with on.once."
    if "waitFor" in run and "replicas" in run:
        yield "run.waitFor", "run.waitFor cannot be combined with run.replicas."


def _azure_work_item_repository(rule: Rule):
    work_item = rule.kind == "azure" and rule.on_type in ("label", "comment")
    if "repository" not in rule.run and not work_item:
        return
    repository = rule.run.get("repository")
    if not work_item:
        yield "run.repository", "run.repository is only for Azure DevOps label and comment triggers."
    elif not trimmed_nonempty(repository) or "/" in repository:
        yield "run.repository", ("run.repository is required for Azure DevOps work item triggers: the name of the "
                                 "repository (in the work item's project) the job works on.")


def _profile_needs_secrets(rule: Rule):
    if "secretsProfile" in rule.run and "secrets" not in rule.run:
        yield "run.secretsProfile", "run.secretsProfile needs run.secrets (the references it resolves)."


# The rules that read several run keys together (each key's own check is its declaration's).
RUN_RULES = (_cron_needs, _a_command_takes_no_prompt, _resume_excludes, _one_shot_and_waits,
             _azure_work_item_repository, _profile_needs_secrets)


def collection_problems(entries: list) -> list[tuple[int, RuleProblem]]:
    """Rules that involve several triggers: one comment trigger per forge, unique cron ids."""
    found: list[tuple[int, RuleProblem]] = []
    comment_forges: dict[str, int] = {}
    cron_ids: dict[str, int] = {}
    for index, entry in enumerate(entries):
        on = entry.get("on") if isinstance(entry, dict) else None
        run = entry.get("run") if isinstance(entry, dict) else None
        if not isinstance(on, dict) or not isinstance(run, dict):
            continue
        if on.get("type") == "comment" and isinstance(run.get("kind"), str):
            if run["kind"] in comment_forges:
                found.append((index, RuleProblem("on.type", (
                    f"a second comment trigger for {run['kind']} (the first is at index "
                    f"{comment_forges[run['kind']]}): one comment trigger per forge; a comment picks another "
                    "flow with `<phrase> <flow>`."))))
            else:
                comment_forges[run["kind"]] = index
        if on.get("type") == "cron" and isinstance(on.get("id"), str):
            if on["id"] in cron_ids:
                found.append((index, RuleProblem("on.id", f"cron id {on['id']!r} is already used at index "
                                                          f"{cron_ids[on['id']]}; cron ids are unique.")))
            else:
                cron_ids[on["id"]] = index
    return found


# --- model <-> file form ----------------------------------------------------------------------------------

def entry_from_trigger(trigger) -> dict:
    """The rule in the file's form; absent fields are left out (as the ancestor writes them)."""
    on: dict = {"type": trigger.on_type}
    if trigger.on_type == "cron":
        on.update(id=trigger.cron_id, pattern=trigger.cron_pattern)
    for key, value in (("any", trigger.label_any), ("all", trigger.label_all), ("none", trigger.label_none),
                       ("phrase", trigger.phrase), ("action", trigger.actions),
                       ("reviewState", trigger.review_states)):
        if value:
            on[key] = run_keys.copied(value)
    if trigger.number is not None:
        on["number"] = trigger.number
    if trigger.once:
        on["once"] = True
    if trigger.disarmed_at is not None:
        on["disarmed"] = {"at": iso_instant(trigger.disarmed_at)}
        if trigger.disarmed_job_id:
            on["disarmed"]["jobId"] = trigger.disarmed_job_id
    return {"on": on, "run": run_keys.file_form(trigger)}


def fields_from_entry(entry: dict) -> dict:
    """Model field values for a valid rule (every field set, so an import overwrites what was there)."""
    on, run = entry["on"], entry["run"]
    disarmed = on.get("disarmed") if on.get("once") is True else None
    return {
        "on_type": on["type"],
        "cron_id": on.get("id", "") if on["type"] == "cron" else "",
        "cron_pattern": on.get("pattern", "") if on["type"] == "cron" else "",
        "label_any": list(on.get("any") or []),
        "label_all": list(on.get("all") or []),
        "label_none": list(on.get("none") or []),
        "phrase": on.get("phrase", ""),
        "actions": list(on.get("action") or []),
        "review_states": list(on.get("reviewState") or []),
        "number": on.get("number"),
        "once": on.get("once") is True,
        "disarmed_at": parse_instant(disarmed["at"]) if disarmed else None,
        "disarmed_job_id": (disarmed or {}).get("jobId", ""),
        **run_keys.stored_fields(run),
    }


def iso_instant(moment: datetime) -> str:
    """`2026-11-29T15:20:00.123Z`, the form the ancestor writes."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- the model's hook -----------------------------------------------------------------------------------------

def validate_trigger_fields(trigger) -> None:
    """Raise a ValidationError keyed by model field (what the admin form shows beside each field)."""
    problems, _ = entry_problems(entry_from_trigger(trigger))
    errors: dict[str, list[str]] = {}
    for problem in problems:
        field = FIELD_PATHS.get(problem.path, "__all__")
        errors.setdefault(field, [])
        if problem.message not in errors[field]:
            errors[field].append(problem.message)
    if errors:
        raise ValidationError(errors)
