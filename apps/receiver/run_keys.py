"""Every key of a trigger's `run`, declared once (as NetBox declares its ConfigParams): its file spelling, the trigger
types that allow it, its shape, its own check, the Trigger field that stores it, the JobSpec field it reaches and
the words the admin form shows. Validation (validation.py), storage (`entry_from_trigger`, `fields_from_entry`),
the trigger form (trigger_form.py), the jobs a rule starts (`job_fields`: dispatch.py, cron.py), import/export and
docs/run-keys.md read this table; a test starts a job from each key and fails for one that reaches none.

A new key: one `RunKey` below, its Trigger field (verbose name `run.<key>`) and migration, its JobSpec field, and
the sample value `tests/receiver/test_run_keys.py` starts a job with. Checks that read several keys together (a
flow or a command, what a cron rule needs, what `resume` excludes) are the rule's, in validation.py.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings

from apps.worker import allowed_models, known_models
from apps.worker.gates.money import MoneyError, parse_usd, to_usd
from apps.worker.gates.secrets import is_reserved as secret_name_is_reserved
from apps.worker.name_patterns import FLOW_PATTERN, MODEL_PATTERN, PROVIDER_PATTERN
from apps.worker.sandbox import folder_roots, venues
from apps.worker.validators import TURNS_RULE, turns_problem

CRON, FORGE = "cron", "forge"  # the two families of trigger types: a schedule on a folder, or a forge's webhook
BOTH = frozenset({CRON, FORGE})

EXCLUDABLE_TOOLS = ("read", "bash", "powershell", "edit", "write", "grep", "find", "ls")
PUBLISH_TO = ("origin", "fork")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
SECRET_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ISO_INSTANT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:\d{2})$")
MAX_INSTRUCTIONS = 2000
MAX_SECRETS = 16
MAX_WAIT_CONDITIONS = 4
MIN_REPLICAS, MAX_REPLICAS = 2, 3
MAX_COMMAND = 200
MAX_IMAGE = 300
MAX_SKILLS_DIR = 500


@dataclass(frozen=True)
class Rule:
    """What a key's check may read besides its value: the rule's type, forge and both sections."""

    on_type: str
    kind: str
    on: dict
    run: dict


# --- shapes: how a value is written in the file, stored on the Trigger and carried by the JobSpec --------------

ABSENT = object()  # a key the file leaves out (the ancestor writes only what is set)


@dataclass(frozen=True)
class Shape:
    to_file: Callable[[Any], Any]  # the stored value as the file writes it, or ABSENT
    from_file: Callable[[Any], Any]  # the file's value (ABSENT when left out) as stored
    to_job: Callable[[Any], Any] = lambda value: value  # the stored value as the JobSpec carries it


def copied(value):
    # JSON fields edited in the admin can hold any JSON; only lists and objects are copied as such, so a
    # wrong shape still reaches validation (and its message) unchanged.
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def _usd_text(value) -> str:
    """A dollar amount as the ancestor writes it: a plain decimal string (`2.5`, never `2.500000` or `2.5E+0`)."""
    if isinstance(value, Decimal):
        text = format(value, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return value  # a wrong type stays as it is, for validation to name


def _given(value):
    return None if value is ABSENT else value


TEXT = Shape(to_file=lambda value: value if value else ABSENT,
             from_file=lambda value: "" if value is ABSENT else value)
# A text the file may also set to null for "the deployment's default".
DEFAULTABLE_TEXT = Shape(to_file=lambda value: value if value else ABSENT,
                         from_file=lambda value: _given(value) or "")
WHOLE = Shape(to_file=lambda value: ABSENT if value is None else value, from_file=_given)
LIST = Shape(to_file=lambda value: copied(value) if value else ABSENT,
             from_file=lambda value: list(_given(value) or []), to_job=lambda value: tuple(value))
OBJECT = Shape(to_file=lambda value: copied(value) if value else ABSENT,
               from_file=lambda value: dict(_given(value) or {}), to_job=lambda value: dict(value))
FLAG = Shape(to_file=lambda value: True if value else ABSENT, from_file=lambda value: value is True)  # off unless set
FLAG_ON = Shape(to_file=lambda value: ABSENT if value else False, from_file=lambda value: value is not False)
USD = Shape(to_file=lambda value: ABSENT if value is None else _usd_text(value),
            from_file=lambda value: to_usd(parse_usd(_given(value))),
            to_job=lambda value: "" if value is None else format(value, "f"))


@dataclass(frozen=True)
class RunKey:
    name: str  # the file's spelling: run.<name>
    field: str  # the Trigger field that stores it
    shape: Shape
    job: str  # the JobSpec field it reaches
    label: str  # the admin form's words
    help: str
    triggers: frozenset[str] = BOTH  # the families of trigger types that may set it
    check: Callable[[Any, Rule], Iterator[str]] | None = None  # the value's own problems (messages for run.<name>)
    form: str = "limits"  # "runs": "What runs" on the form; "limits": "Limits and extras"
    example: str = ""  # a list's example, in the form's comma-separated words

    @property
    def path(self) -> str:
        return f"run.{self.name}"

    def allowed_for(self, on_type: str) -> bool:
        return (CRON if on_type == "cron" else FORGE) in self.triggers


# --- the checks of one key's value -----------------------------------------------------------------------------

def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def trimmed_nonempty(value) -> bool:
    return isinstance(value, str) and bool(value) and value == value.strip()


def string_list_problem(value, path: str, *, allow_empty: bool = True) -> str | None:
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


def _flag(name: str):
    def check(value, rule: Rule) -> Iterator[str]:
        if not isinstance(value, bool):
            yield f"run.{name} must be true or false."
    return check


def _flow(value, rule: Rule) -> Iterator[str]:
    if not isinstance(value, str) or not FLOW_PATTERN.fullmatch(value):
        yield ("run.flow must be 1-64 lowercase letters, digits, '-' or '_', starting and ending with a letter or "
               "digit.")


def _command(value, rule: Rule) -> Iterator[str]:
    if (not trimmed_nonempty(value) or value.startswith("/") or len(value) > MAX_COMMAND
            or any(unicodedata.category(ch) == "Cc" for ch in value)):
        yield (f"run.command must be a command name without a leading '/', surrounding spaces or control characters "
               f"(at most {MAX_COMMAND} characters).")


def _image(value, rule: Rule) -> Iterator[str]:
    if not trimmed_nonempty(value) or value.startswith("-") or len(value) > MAX_IMAGE:
        yield "run.image must be an image reference without surrounding spaces or a leading '-'."


def _instructions(value, rule: Rule) -> Iterator[str]:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_INSTRUCTIONS:
        yield f"run.instructions must be non-empty text of at most {MAX_INSTRUCTIONS} characters."


def _publish_to(value, rule: Rule) -> Iterator[str]:
    if value not in PUBLISH_TO:
        yield ("run.publishTo must be fork (the deployment's fork) or origin (a branch of the repository itself, "
               "where its CI runs the agent's code with its secrets).")


def _skills_dir(value, rule: Rule) -> Iterator[str]:
    if not trimmed_nonempty(value) or len(value) > MAX_SKILLS_DIR or not value.startswith("/"):
        yield (f"run.skillsDir must be an absolute folder on the worker host, without surrounding spaces (at most "
               f"{MAX_SKILLS_DIR} characters).")
    elif not (judged := folder_roots.judge(value, folder_roots.SKILLS)).allowed:
        # Judged here by this host's roots (the web's environment declares the workers'), and again by the worker
        # that copies it: its real path there may differ.
        yield f"run.skillsDir is refused: {folder_roots.SKILLS.hint(judged.why)}."


def _backend(value, rule: Rule) -> Iterator[str]:
    problem = venues.trigger_problem(value, local_folder=rule.kind == "local")
    if problem:
        yield f"run.backend {problem}"


def _replicas(value, rule: Rule) -> Iterator[str]:
    if not is_int(value) or not MIN_REPLICAS <= value <= MAX_REPLICAS:
        yield (f"run.replicas must be a whole number from {MIN_REPLICAS} to {MAX_REPLICAS} (leave it out for one "
               "job).")


def _wait_for(conditions, rule: Rule) -> Iterator[str]:
    path = "run.waitFor"
    if not isinstance(conditions, list) or not 1 <= len(conditions) <= MAX_WAIT_CONDITIONS:
        yield (f"{path} must be a list of 1 to {MAX_WAIT_CONDITIONS} conditions, each {{\"after\": <instant>}} or "
               "{\"profile\": <name>}.")
        return
    afters, profiles = 0, set()
    for condition in conditions:
        if isinstance(condition, dict) and "exclusive" in condition:
            yield (f"{path}: `exclusive` is not a wait condition; to run one job at a time per scope use a scoped "
                   "limit with `concurrent`.")
            continue
        if not isinstance(condition, dict) or len(condition) != 1:
            yield f"{path}: each condition is an object with exactly one key, after or profile."
            continue
        (key, value), = condition.items()
        if key == "after":
            afters += 1
            if parse_instant(value) is None:
                yield f"{path}: after must be an ISO 8601 instant with its zone, e.g. \"2026-12-01T09:00:00Z\"."
        elif key == "profile":
            if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
                yield f"{path}: profile must be a wait profile name (letters, digits, '.', '_', '-')."
            elif value in profiles:
                yield f"{path}: profile {value!r} is listed twice."
            profiles.add(value)
        else:
            yield f"{path}: {key!r} is not a wait condition (after or profile)."
    if afters > 1:
        yield f"{path}: at most one after condition."


def _secrets(secrets, rule: Rule) -> Iterator[str]:
    path = "run.secrets"
    if not isinstance(secrets, dict) or not 1 <= len(secrets) <= MAX_SECRETS:
        yield (f"{path} must be an object of 1 to {MAX_SECRETS} NAME: reference entries (references only; the "
               "worker resolves them).")
        return
    for name, reference in secrets.items():
        if not isinstance(name, str) or not SECRET_NAME_PATTERN.fullmatch(name) or name == "__proto__":
            yield f"{path}: {name!r} is not an environment variable name."
        elif secret_name_is_reserved(name):  # the worker's own list: one source for both checks
            yield f"{path}: {name} is set by the runtime itself and cannot be a secret."
        if not trimmed_nonempty(reference) or reference.startswith("-"):
            yield (f"{path}: the reference for {name} must be non-empty, without surrounding spaces or a leading "
                   "'-'.")


def _secrets_profile(value, rule: Rule) -> Iterator[str]:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        yield "run.secretsProfile must be a profile name: letters, digits, '.', '_' or '-'."


def _exclude_tools(tools, rule: Rule) -> Iterator[str]:
    problem = string_list_problem(tools, "run.excludeTools", allow_empty=False)
    if problem or any(tool not in EXCLUDABLE_TOOLS for tool in tools):
        yield (f"run.excludeTools must be a non-empty list without repeats, drawn from "
               f"{', '.join(EXCLUDABLE_TOOLS)}.")


def _provider(value, rule: Rule) -> Iterator[str]:
    if value is not None and (not isinstance(value, str) or not PROVIDER_PATTERN.fullmatch(value)):
        yield ("run.provider must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (null = "
               "the deployment's default).")


def _model(value, rule: Rule) -> Iterator[str]:
    if value is not None and (not isinstance(value, str) or not MODEL_PATTERN.fullmatch(value)):
        yield ("run.model must be 1-64 letters, digits or . _ - : / @, starting with a letter or digit (null = the "
               "deployment's default).")
    elif problem := known_models.refusal(_provider_of(rule), value or ""):
        yield f"run.model: {problem}"


def _provider_of(rule: Rule) -> str:
    provider = rule.run.get("provider")
    return provider if isinstance(provider, str) and provider else settings.PI_PROVIDER


def _models(value, rule: Rule) -> Iterator[str]:
    try:
        allowed_models.check(value, "run.models")
    except allowed_models.ModelListError as error:
        yield str(error)
        return
    problem = (allowed_models.main_model_problem(rule.run.get("provider"), rule.run.get("model"), value, "run.models")
               or known_models.entries_refusal(value, "run.models"))
    if problem:
        yield problem


def _max_turns(value, rule: Rule) -> Iterator[str]:
    if turns_problem(value) or value is None:
        yield f"run.maxTurns must be {TURNS_RULE}."


def _max_cost_usd(value, rule: Rule) -> Iterator[str]:
    try:
        if parse_usd(value) is None:
            raise MoneyError("must be set (leave the key out for the deployment's cap)")
    except MoneyError as error:
        yield f"run.maxCostUsd {error}."


# --- the keys, in the form's order ----------------------------------------------------------------------------

RUN_KEYS: tuple[RunKey, ...] = (
    RunKey("kind", "kind", TEXT, "kind", "Forge", "Which forge's webhooks fire it.", form="runs"),
    RunKey("folder", "folder", TEXT, "folder", "Folder on the worker host",
           "A git checkout on the host that runs the schedule, e.g. /srv/code/app", triggers=frozenset({CRON}),
           form="runs"),
    RunKey("flow", "flow", TEXT, "flow", "Flow", "The pi skill the agent runs, e.g. fix-bug. Give a flow or a command.",
           check=_flow, form="runs"),
    RunKey("command", "command", TEXT, "command", "Or a command",
           "A pi extension command instead of a flow, without '/', e.g. triage", check=_command, form="runs"),
    RunKey("task", "task", TEXT, "task", "Task", "What the agent does on each run (its prompt), e.g. Upgrade the "
                                                 "linter config.", triggers=frozenset({CRON}), form="runs"),
    RunKey("instructions", "instructions", TEXT, "instructions", "Standing instructions",
           f"Put above the issue's text on every run (at most {MAX_INSTRUCTIONS} characters), e.g. Keep changes small "
           "and add a test.", triggers=frozenset({FORGE}), check=_instructions, form="runs"),
    RunKey("repository", "repository", TEXT, "repo", "Azure DevOps repository",
           "Work item rules only: the repository in the work item's project, e.g. web", triggers=frozenset({FORGE}),
           form="runs"),
    RunKey("provider", "provider", DEFAULTABLE_TEXT, "provider", "Model provider",
           "Empty: the deployment's (PI_PROVIDER). e.g. anthropic", check=_provider),
    RunKey("model", "model", DEFAULTABLE_TEXT, "model", "Model",
           "Empty: the deployment's (PI_MODEL). e.g. claude-sonnet-4-5", check=_model),
    RunKey("models", "allowed_models", LIST, "models", "Allowed models",
           "provider/model entries the agent may choose among (1-16, the model above among them); the gateway "
           "refuses any other. Empty: PI_ALLOWED_MODELS, else any. e.g. anthropic/claude-sonnet-4-5, "
           "anthropic/claude-haiku-4-5", check=_models,
           example="anthropic/claude-sonnet-4-5, anthropic/claude-haiku-4-5"),
    RunKey("maxTurns", "max_turns", WHOLE, "max_turns", "Max turns", "Empty: Settings or PI_MAX_TURNS (30). e.g. 20",
           check=_max_turns),
    RunKey("maxCostUsd", "max_cost_usd", USD, "max_cost_usd", "Most dollars per run",
           "Lowers the deployment's per-run cap (PI_MAX_COST_USD), never raises it. Empty: that cap. e.g. 0.50",
           check=_max_cost_usd),
    RunKey("replicas", "replicas", WHOLE, "replicas", "Parallel agents",
           "2 or 3 agents on the same event, each with its own pull request. Empty: one.",
           triggers=frozenset({FORGE}), check=_replicas),
    RunKey("waitFor", "wait_for", LIST, "wait_for", "Wait before running",
           "Comma-separated: after <time with zone>, profile <check name>. e.g. after 2026-12-01T09:00:00Z, profile "
           "ci-green", triggers=frozenset({FORGE}), check=_wait_for,
           example="after 2026-12-01T09:00:00Z, profile ci-green"),
    RunKey("resume", "resume", FLAG, "resume", "Continue the conversation",
           "The next job on the same issue or pull request (a schedule: its next run) continues this one's agent "
           "session. Never for a fork's pull request; not with parallel agents, secrets or a command.",
           check=_flag("resume")),
    RunKey("github", "github", FLAG, "github", "Publish to GitHub",
           "The worker pushes the run's commits to a branch of the folder's GitHub repository (its origin) and opens "
           "a pull request. The agent never holds a token.", triggers=frozenset({CRON}), check=_flag("github")),
    RunKey("allowCiChanges", "allow_ci_changes", FLAG, "allow_ci_changes", "May change CI files",
           "Off: a change to .github/workflows/, .gitlab-ci.yml, ... is not pushed, and the work is kept for you to "
           "review.", triggers=frozenset({FORGE}), check=_flag("allowCiChanges")),
    RunKey("publishTo", "publish_to", TEXT, "publish_to", "Push the work to",
           "fork: the deployment's own fork; the pull request is an outside contribution, and the repository's CI "
           "gives it no secret until a person approves it (GitHub, GitLab, Forgejo, Azure DevOps). origin: a branch "
           "of the repository itself, where its CI runs the agent's code with the repository's secrets. Empty: the "
           "deployment's PI_PUBLISH_TO (fork unless set).", triggers=frozenset({FORGE}), check=_publish_to),
    RunKey("image", "image", TEXT, "image", "Job image", "Empty: PI_JOB_IMAGE. e.g. pi-job:latest", check=_image),
    RunKey("backend", "backend", TEXT, "backend", "Venue",
           "Where the container runs, among the host's PI_BACKENDS. Empty: local (the host's Docker).",
           check=_backend),
    RunKey("packages", "packages", FLAG_ON, "packages", "Load staged pi packages",
           "Off: the job runs without the packages staged in the host's pi overlay (PI_GLOBAL_PI_DIR).",
           check=_flag("packages")),
    RunKey("skillsDir", "skills_dir", TEXT, "skills_dir", "Extra skills folder",
           "A folder of skills on the worker host, under a root it declares (PI_SKILLS_ROOTS), copied into each job "
           "as any user of the host may read it, e.g. /srv/pi-skills/review", check=_skills_dir),
    RunKey("excludeTools", "exclude_tools", LIST, "exclude_tools", "Tools the agent may not use",
           f"Comma-separated, from {', '.join(EXCLUDABLE_TOOLS)}. e.g. bash, write", check=_exclude_tools,
           example="bash, write"),
    RunKey("secrets", "secrets", OBJECT, "secrets", "Secrets, by reference",
           "NAME=reference, comma-separated, e.g. NPM_TOKEN=npm/ci. The host's resolver turns each reference into its "
           "value; never type a value here.", check=_secrets, example="NPM_TOKEN=npm/ci"),
    RunKey("secretsProfile", "secrets_profile", TEXT, "secrets_profile", "Resolver",
           "Which resolver of PI_SECRET_PROFILES answers, e.g. vault. Empty: the host's only one.",
           check=_secrets_profile),
)
BY_NAME = {key.name: key for key in RUN_KEYS}
BY_FIELD = {key.field: key for key in RUN_KEYS}


def file_form(trigger) -> dict:
    """A trigger's `run` in the file's form: the keys it sets, in the table's order (`kind` first)."""
    run = {}
    for key in RUN_KEYS:
        value = key.shape.to_file(getattr(trigger, key.field))
        if value is not ABSENT:
            run[key.name] = value
    return run


def stored_fields(run: dict) -> dict:
    """A valid rule's `run` as Trigger field values (every field set, so an import overwrites what was there)."""
    return {key.field: key.shape.from_file(run.get(key.name, ABSENT)) for key in RUN_KEYS}


def job_fields(trigger) -> dict:
    """What a trigger's `run` says about its jobs, as JobSpec fields: every key its type may set (a key of the other
    family stays at the JobSpec's default, as validation refused it)."""
    return {key.job: key.shape.to_job(getattr(trigger, key.field)) for key in RUN_KEYS
            if key.allowed_for(trigger.on_type)}
