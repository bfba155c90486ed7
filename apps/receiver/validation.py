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
from decimal import Decimal

from croniter import croniter
from django.core.exceptions import ValidationError

from apps import forge_registry
from apps.worker import allowed_models
from apps.worker.gates.money import MoneyError, parse_usd, to_usd
from apps.worker.gates.secrets import is_reserved as secret_name_is_reserved
from apps.worker.name_patterns import FLOW_PATTERN, MODEL_PATTERN, PROVIDER_PATTERN
from apps.worker.sandbox import folder_roots, venues

# --- vocabulary ------------------------------------------------------------------------------------------

TRIGGER_TYPES = ("cron", "label", "comment", "pull_request", "issue")
FORGE_KINDS = forge_registry.NAMES
RUN_KINDS = ("local", *FORGE_KINDS)

PR_ACTIONS = {forge.name: forge.pr_actions for forge in forge_registry.FORGES}
CLOSE_WORDS = {forge.name: forge.close_word for forge in forge_registry.FORGES if forge.close_word}
PR_LABEL_ACTIONS = {forge.name: forge.pr_label_action for forge in forge_registry.FORGES if forge.pr_label_action}
REVIEW_ACTION = "review_submitted"
REVIEW_STATES = ("approved", "changes_requested", "commented")
EXCLUDABLE_TOOLS = ("read", "bash", "powershell", "edit", "write", "grep", "find", "ls")

NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
CRON_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
SECRET_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ISO_INSTANT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:\d{2})$")

MAX_INSTRUCTIONS = 2000
MAX_SECRETS = 16
MAX_WAIT_CONDITIONS = 4
MIN_REPLICAS, MAX_REPLICAS = 2, 3
MAX_PHRASE = 100
MAX_COMMAND = 200
MAX_IMAGE = 300
MAX_SKILLS_DIR = 500

# A secret reference may not shadow what the runtime itself sets in the container.

# --- which keys exist where -------------------------------------------------------------------------------

ON_KEYS = ("type", "id", "pattern", "any", "all", "none", "phrase", "action", "reviewState", "number", "once",
           "disarmed")
RUN_KEYS = ("kind", "flow", "command", "task", "folder", "image", "instructions", "replicas", "waitFor",
            "secrets", "secretsProfile", "repository", "excludeTools", "provider", "model", "models", "maxTurns",
            "maxCostUsd", "resume", "allowCiChanges", "publishTo", "packages", "skillsDir", "github", "backend")
ON_KEYS_BY_TYPE = {
    "cron": {"type", "id", "pattern"},
    "label": {"type", "any", "all", "none"},
    "comment": {"type", "phrase"},
    "pull_request": {"type", "action", "any", "all", "none", "reviewState", "number", "once", "disarmed"},
    "issue": {"type", "action", "number", "once", "disarmed"},
}
CRON_ONLY_RUN_KEYS = {"task", "folder", "github"}
FORGE_ONLY_RUN_KEYS = {"instructions", "replicas", "waitFor", "repository", "allowCiChanges", "publishTo"}
PUBLISH_TO = ("origin", "fork")
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

# --- the one field table: file spelling <-> model field ------------------------------------------------------

FIELD_PATHS = {
    "on.type": "on_type", "on.id": "cron_id", "on.pattern": "cron_pattern", "on.any": "label_any",
    "on.all": "label_all", "on.none": "label_none", "on.phrase": "phrase", "on.action": "actions",
    "on.reviewState": "review_states", "on.number": "number", "on.once": "once", "on.disarmed": "disarmed_at",
    "run.kind": "kind", "run.flow": "flow", "run.command": "command", "run.task": "task", "run.folder": "folder",
    "run.image": "image", "run.instructions": "instructions", "run.replicas": "replicas",
    "run.waitFor": "wait_for", "run.secrets": "secrets", "run.secretsProfile": "secrets_profile",
    "run.repository": "repository", "run.excludeTools": "exclude_tools", "run.provider": "provider",
    "run.model": "model", "run.models": "allowed_models", "run.maxTurns": "max_turns",
    "run.maxCostUsd": "max_cost_usd", "run.resume": "resume",
    "run.allowCiChanges": "allow_ci_changes", "run.publishTo": "publish_to", "run.packages": "packages",
    "run.skillsDir": "skills_dir",
    "run.github": "github", "run.backend": "backend",
}


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


# --- small checks -----------------------------------------------------------------------------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _trimmed_nonempty(value) -> bool:
    return isinstance(value, str) and bool(value) and value == value.strip()


def _string_list_problem(value, path: str, *, allow_empty: bool = True) -> str | None:
    if not isinstance(value, list):
        return f"{path} must be a list of strings."
    if any(not isinstance(item, str) or not item.strip() for item in value):
        return f"{path} must hold non-empty strings."
    if len(set(value)) != len(value):
        return f"{path} lists the same value twice."
    if not allow_empty and not value:
        return f"{path} must not be empty."
    return None


def parse_instant(value) -> datetime | None:
    """An ISO 8601 instant that carries its zone (`Z` or `+01:00`), or None."""
    if not isinstance(value, str) or not ISO_INSTANT.fullmatch(value):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


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
    for key in run:
        if on_type == "cron" and key in FORGE_ONLY_RUN_KEYS:
            problems.add(f"run.{key}", f"run.{key} is for forge triggers, not cron triggers.")
        if on_type != "cron" and key in CRON_ONLY_RUN_KEYS:
            problems.add(f"run.{key}",
                         f"run.{key} is only for cron triggers (a forge job works on the issue's repository).")

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
            problem = _string_list_problem(on[key], f"on.{key}")
            if problem:
                problems.add(f"on.{key}", problem.replace("strings", "label names"))
                ok = False
    return ok and bool(on.get("any") or on.get("all"))


def _check_on(on_type, kind, on, run, problems: _Problems) -> None:  # noqa: C901 (issue 50 §2 replaces it)
    if on_type == "cron":
        cron_id, pattern = on.get("id"), on.get("pattern")
        if not isinstance(cron_id, str) or not CRON_ID_PATTERN.fullmatch(cron_id):
            problems.add("on.id", "on.id must name the cron trigger: 1-64 letters, digits, '.', '_' or '-' (no ':').")
        fields = pattern.split() if isinstance(pattern, str) else []
        if len(fields) not in (5, 6) or not croniter.is_valid(pattern, second_at_beginning=len(fields) == 6):
            problems.add("on.pattern", "on.pattern must be a cron expression of 5 or 6 space-separated fields, "
                                       "e.g. \"0 6 * * 1-5\".")
        return

    if on_type == "label":
        positive = _check_predicate(on, problems)
        if not positive and not problems_for(problems, "on.any", "on.all"):
            problems.add("on.any", "A label trigger needs at least one positive selector: on.any or on.all must "
                                   "name a label (on.none alone can only suppress, never fire).")
        return

    if on_type == "comment":
        phrase = on.get("phrase")
        if not isinstance(phrase, str) or not phrase.strip() or len(phrase) > MAX_PHRASE:
            problems.add("on.phrase", f"on.phrase must be the non-empty text a comment must contain "
                                      f"(at most {MAX_PHRASE} characters), e.g. \"@pi\".")
        return

    # pull_request and issue: on.action from the forge's own vocabulary
    if kind not in FORGE_KINDS:
        return
    actions = on.get("action")
    vocabulary = (PR_ACTIONS[kind] if on_type == "pull_request"
                  else ((CLOSE_WORDS[kind],) if kind in CLOSE_WORDS else ()))
    if on_type == "issue" and kind == "azure":
        problems.add("run.kind", "issue (close) triggers are not available for Azure DevOps work items.")
        return
    problem = _string_list_problem(actions, "on.action", allow_empty=False) if "action" in on else \
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

        if "reviewState" in on:
            states = on["reviewState"]
            if kind != "github":
                problems.add("on.reviewState", "on.reviewState exists only for GitHub reviews.")
            elif REVIEW_ACTION not in actions:
                problems.add("on.reviewState", f"on.reviewState needs {REVIEW_ACTION!r} in on.action.")
            else:
                problem = _string_list_problem(states, "on.reviewState", allow_empty=False)
                if problem or any(state not in REVIEW_STATES for state in states):
                    problems.add("on.reviewState", f"on.reviewState must be a non-empty list drawn from "
                                                   f"{', '.join(REVIEW_STATES)}.")

    for key in ("number", "once", "disarmed"):
        if key in on and not close:
            problems.add(f"on.{key}", f"on.{key} is only for close rules (an issue rule, or a pull_request rule "
                                      "whose only action is the close word).")
    if not close:
        return
    number, once = on.get("number"), on.get("once")
    if "number" in on and (not _is_int(number) or number < 1):
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
              or ("jobId" in disarmed and not _trimmed_nonempty(disarmed.get("jobId")))):
            problems.add("on.disarmed", "on.disarmed must be {\"at\": <ISO 8601 instant with zone>, \"jobId\": "
                                        "<job id>} (delete it to re-arm the rule).")


def problems_for(problems, *paths) -> bool:
    return any(problem.path in paths for problem in problems)


def _check_run(on_type, kind, on, run, problems: _Problems) -> None:  # noqa: C901 (issue 50 §2 replaces it)
    flow, command = run.get("flow"), run.get("command")
    if ("flow" in run) == ("command" in run):
        problems.add("run.flow", "run needs exactly one of run.flow (a pi skill) or run.command (a pi extension "
                                 "command).")
    if "flow" in run and (not isinstance(flow, str) or not FLOW_PATTERN.fullmatch(flow)):
        problems.add("run.flow", "run.flow must be 1-64 lowercase letters, digits, '-' or '_', starting and ending "
                                 "with a letter or digit.")
    if "command" in run and (not _trimmed_nonempty(command) or command.startswith("/") or len(command) > MAX_COMMAND
                             or any(unicodedata.category(ch) == "Cc" for ch in command)):
        problems.add("run.command", f"run.command must be a command name without a leading '/', surrounding "
                                    f"spaces or control characters (at most {MAX_COMMAND} characters).")

    if on_type == "cron":
        if not _trimmed_nonempty(run.get("folder")):
            problems.add("run.folder", "run.folder is required: the folder on the worker host the cron job works in.")
        if "flow" in run and not (isinstance(run.get("task"), str) and run["task"].strip()):
            problems.add("run.task", "run.task is required beside run.flow: the cron job's prompt.")
        if "command" in run and "task" in run:
            problems.add("run.task", "run.task cannot be combined with run.command (a command takes no prompt).")

    if "image" in run:
        image = run["image"]
        if not _trimmed_nonempty(image) or image.startswith("-") or len(image) > MAX_IMAGE:
            problems.add("run.image",
                         "run.image must be an image reference without surrounding spaces or a leading '-'.")
    if "instructions" in run:
        text = run["instructions"]
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_INSTRUCTIONS:
            problems.add("run.instructions", f"run.instructions must be non-empty text of at most {MAX_INSTRUCTIONS} "
                                             "characters.")
        elif "command" in run:
            problems.add("run.instructions", "run.instructions cannot be combined with run.command (a command takes "
                                             "no prompt).")
    if "allowCiChanges" in run and not isinstance(run["allowCiChanges"], bool):
        problems.add("run.allowCiChanges", "run.allowCiChanges must be true or false.")
    if "publishTo" in run and run["publishTo"] not in PUBLISH_TO:
        problems.add("run.publishTo", "run.publishTo must be fork (the deployment's fork) or origin (a branch of "
                                      "the repository itself, where its CI runs the agent's code with its secrets).")
    for key in ("packages", "github"):
        if key in run and not isinstance(run[key], bool):
            problems.add(f"run.{key}", f"run.{key} must be true or false.")
    if "skillsDir" in run:
        skills_dir = run["skillsDir"]
        if not _trimmed_nonempty(skills_dir) or len(skills_dir) > MAX_SKILLS_DIR or not skills_dir.startswith("/"):
            problems.add("run.skillsDir", f"run.skillsDir must be an absolute folder on the worker host, without "
                                          f"surrounding spaces (at most {MAX_SKILLS_DIR} characters).")
        elif not (judged := folder_roots.judge(skills_dir, folder_roots.SKILLS)).allowed:
            # Judged here by this host's roots (the web's environment declares the workers'), and again by the
            # worker that copies it: its real path there may differ.
            problems.add("run.skillsDir", f"run.skillsDir is refused: {folder_roots.SKILLS.hint(judged.why)}.")
    if "backend" in run:
        problem = venues.trigger_problem(run["backend"], local_folder=kind == "local")
        if problem:
            problems.add("run.backend", f"run.backend {problem}")
    resume = run.get("resume")
    if "resume" in run and not isinstance(resume, bool):
        problems.add("run.resume", "run.resume must be true or false.")
    if resume is True:
        for other in ("replicas", "secrets", "command"):
            if other in run:
                problems.add("run.resume", f"run.resume: true cannot be combined with run.{other}.")
    if "replicas" in run:
        replicas = run["replicas"]
        if not _is_int(replicas) or not MIN_REPLICAS <= replicas <= MAX_REPLICAS:
            problems.add("run.replicas", f"run.replicas must be a whole number from {MIN_REPLICAS} to {MAX_REPLICAS} "
                                         "(leave it out for one job).")
        if on.get("once") is True:
            problems.add("run.replicas", "run.replicas cannot be combined with on.once (a one-shot runs once).")
    if "waitFor" in run:
        _check_wait_for(run["waitFor"], problems)
        if on.get("once") is True:
            problems.add("run.waitFor", "run.waitFor cannot be combined with on.once.")
        if "replicas" in run:
            problems.add("run.waitFor", "run.waitFor cannot be combined with run.replicas.")
    if "repository" in run or (kind == "azure" and on_type in ("label", "comment")):
        repository = run.get("repository")
        if not (kind == "azure" and on_type in ("label", "comment")):
            problems.add("run.repository", "run.repository is only for Azure DevOps label and comment triggers.")
        elif not _trimmed_nonempty(repository) or "/" in repository:
            problems.add("run.repository", "run.repository is required for Azure DevOps work item triggers: the "
                                           "name of the repository (in the work item's project) the job works on.")
    if "secrets" in run:
        _check_secrets(run["secrets"], problems)
    if "secretsProfile" in run:
        profile = run["secretsProfile"]
        if not isinstance(profile, str) or not NAME_PATTERN.fullmatch(profile):
            problems.add("run.secretsProfile", "run.secretsProfile must be a profile name: letters, digits, '.', '_' "
                                               "or '-'.")
        elif "secrets" not in run:
            problems.add("run.secretsProfile", "run.secretsProfile needs run.secrets (the references it resolves).")
    if "excludeTools" in run:
        tools = run["excludeTools"]
        problem = _string_list_problem(tools, "run.excludeTools", allow_empty=False)
        if problem or any(tool not in EXCLUDABLE_TOOLS for tool in tools):
            problems.add("run.excludeTools", f"run.excludeTools must be a non-empty list without repeats, drawn from "
                                             f"{', '.join(EXCLUDABLE_TOOLS)}.")
    if run.get("provider") is not None and (not isinstance(run["provider"], str)
                                            or not PROVIDER_PATTERN.fullmatch(run["provider"])):
        problems.add("run.provider", "run.provider must be 1-64 letters, digits, '.', '_' or '-', starting with a "
                                     "letter or digit (null = the deployment's default).")
    if run.get("model") is not None and (not isinstance(run["model"], str)
                                         or not MODEL_PATTERN.fullmatch(run["model"])):
        problems.add("run.model", "run.model must be 1-64 letters, digits or . _ - : / @, starting with a letter or "
                                  "digit (null = the deployment's default).")
    if "models" in run:
        try:
            allowed_models.check(run["models"], "run.models")
        except allowed_models.ModelListError as error:
            problems.add("run.models", str(error))
        else:
            problem = allowed_models.main_model_problem(run.get("provider"), run.get("model"), run["models"],
                                                        "run.models")
            if problem:
                problems.add("run.models", problem)
    if "maxTurns" in run and (not _is_int(run["maxTurns"]) or run["maxTurns"] < 1):
        problems.add("run.maxTurns", "run.maxTurns must be a whole number >= 1.")
    if "maxCostUsd" in run:
        try:
            if parse_usd(run["maxCostUsd"]) is None:
                raise MoneyError("must be set (leave the key out for the deployment's cap)")
        except MoneyError as error:
            problems.add("run.maxCostUsd", f"run.maxCostUsd {error}.")


def _check_wait_for(conditions, problems: _Problems) -> None:
    path = "run.waitFor"
    if not isinstance(conditions, list) or not 1 <= len(conditions) <= MAX_WAIT_CONDITIONS:
        problems.add(path, f"{path} must be a list of 1 to {MAX_WAIT_CONDITIONS} conditions, each "
                           "{\"after\": <instant>} or {\"profile\": <name>}.")
        return
    afters, profiles = 0, set()
    for condition in conditions:
        if isinstance(condition, dict) and "exclusive" in condition:
            problems.add(path, f"{path}: `exclusive` is not a wait condition; to run one job at a time per scope "
                               "use a scoped limit with `concurrent`.")
            continue
        if not isinstance(condition, dict) or len(condition) != 1:
            problems.add(path, f"{path}: each condition is an object with exactly one key, after or profile.")
            continue
        (key, value), = condition.items()
        if key == "after":
            afters += 1
            if parse_instant(value) is None:
                problems.add(path, f"{path}: after must be an ISO 8601 instant with its zone, e.g. "
                                   "\"2026-12-01T09:00:00Z\".")
        elif key == "profile":
            if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
                problems.add(path, f"{path}: profile must be a wait profile name (letters, digits, '.', '_', '-').")
            elif value in profiles:
                problems.add(path, f"{path}: profile {value!r} is listed twice.")
            profiles.add(value)
        else:
            problems.add(path, f"{path}: {key!r} is not a wait condition (after or profile).")
    if afters > 1:
        problems.add(path, f"{path}: at most one after condition.")


def _check_secrets(secrets, problems: _Problems) -> None:
    path = "run.secrets"
    if not isinstance(secrets, dict) or not 1 <= len(secrets) <= MAX_SECRETS:
        problems.add(path, f"{path} must be an object of 1 to {MAX_SECRETS} NAME: reference entries (references "
                           "only; the worker resolves them).")
        return
    for name, reference in secrets.items():
        if not isinstance(name, str) or not SECRET_NAME_PATTERN.fullmatch(name) or name == "__proto__":
            problems.add(path, f"{path}: {name!r} is not an environment variable name.")
        elif secret_name_is_reserved(name):  # the worker's own list: one source for both checks
            problems.add(path, f"{path}: {name} is set by the runtime itself and cannot be a secret.")
        if not _trimmed_nonempty(reference) or reference.startswith("-"):
            problems.add(path, f"{path}: the reference for {name} must be non-empty, without surrounding spaces "
                               "or a leading '-'.")


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

def entry_from_trigger(trigger) -> dict:  # noqa: C901 (issue 50 §2 replaces it)
    """The rule in the file's form; absent fields are left out (as the ancestor writes them)."""
    on: dict = {"type": trigger.on_type}
    if trigger.on_type == "cron":
        on.update(id=trigger.cron_id, pattern=trigger.cron_pattern)
    for key, value in (("any", trigger.label_any), ("all", trigger.label_all), ("none", trigger.label_none)):
        if value:
            on[key] = _copy(value)
    if trigger.phrase:
        on["phrase"] = trigger.phrase
    if trigger.actions:
        on["action"] = _copy(trigger.actions)
    if trigger.review_states:
        on["reviewState"] = _copy(trigger.review_states)
    if trigger.number is not None:
        on["number"] = trigger.number
    if trigger.once:
        on["once"] = True
    if trigger.disarmed_at is not None:
        on["disarmed"] = {"at": iso_instant(trigger.disarmed_at)}
        if trigger.disarmed_job_id:
            on["disarmed"]["jobId"] = trigger.disarmed_job_id

    run: dict = {"kind": trigger.kind}
    for key, field in (("flow", "flow"), ("command", "command"), ("task", "task"), ("folder", "folder"),
                       ("image", "image"), ("instructions", "instructions")):
        value = getattr(trigger, field)
        if value:
            run[key] = value
    if trigger.replicas is not None:
        run["replicas"] = trigger.replicas
    for key, field in (("waitFor", "wait_for"), ("secrets", "secrets")):
        value = getattr(trigger, field)
        if value:
            run[key] = _copy(value)
    for key, field in (("secretsProfile", "secrets_profile"), ("repository", "repository")):
        value = getattr(trigger, field)
        if value:
            run[key] = value
    if trigger.exclude_tools:
        run["excludeTools"] = _copy(trigger.exclude_tools)
    if trigger.provider:
        run["provider"] = trigger.provider
    if trigger.model:
        run["model"] = trigger.model
    if trigger.allowed_models:
        run["models"] = _copy(trigger.allowed_models)
    if trigger.max_turns is not None:
        run["maxTurns"] = trigger.max_turns
    if trigger.max_cost_usd is not None:
        run["maxCostUsd"] = _usd_text(trigger.max_cost_usd)
    if trigger.resume:
        run["resume"] = True
    if trigger.allow_ci_changes:
        run["allowCiChanges"] = True
    if trigger.publish_to:
        run["publishTo"] = trigger.publish_to
    if not trigger.packages:
        run["packages"] = False
    if trigger.skills_dir:
        run["skillsDir"] = trigger.skills_dir
    if trigger.github:
        run["github"] = True
    if trigger.backend:
        run["backend"] = trigger.backend
    return {"on": on, "run": run}


def _usd_text(value) -> str:
    """A dollar amount as the ancestor writes it: a plain decimal string (`2.5`, never `2.500000` or `2.5E+0`)."""
    if isinstance(value, Decimal):
        text = format(value, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return value  # a wrong type stays as it is, for validation to name


def _copy(value):
    # JSON fields edited in the admin can hold any JSON; only lists and objects are copied as such, so a
    # wrong shape still reaches validation (and its message) unchanged.
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


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
        "kind": run["kind"],
        "flow": run.get("flow", ""),
        "command": run.get("command", ""),
        "task": run.get("task", ""),
        "folder": run.get("folder", ""),
        "image": run.get("image", ""),
        "instructions": run.get("instructions", ""),
        "replicas": run.get("replicas"),
        "wait_for": list(run.get("waitFor") or []),
        "secrets": dict(run.get("secrets") or {}),
        "secrets_profile": run.get("secretsProfile", ""),
        "repository": run.get("repository", ""),
        "exclude_tools": list(run.get("excludeTools") or []),
        "provider": run.get("provider") or "",
        "model": run.get("model") or "",
        "allowed_models": list(run.get("models") or []),
        "max_turns": run.get("maxTurns"),
        "max_cost_usd": to_usd(parse_usd(run.get("maxCostUsd"))),
        "resume": run.get("resume") is True,
        "allow_ci_changes": run.get("allowCiChanges") is True,
        "publish_to": run.get("publishTo", ""),
        "packages": run.get("packages") is not False,
        "skills_dir": run.get("skillsDir", ""),
        "github": run.get("github") is True,
        "backend": run.get("backend", ""),
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
