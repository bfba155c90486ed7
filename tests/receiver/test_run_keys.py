"""Every run key is declared once (apps/receiver/run_keys.py) and each declared key does something: set in a rule
that validates, it is stored, exported as it was written, and changes the job the rule starts, as a worker reads
it back from the queue. A key declared without reaching a job, or stored without being declared, fails here."""

from datetime import UTC, datetime

import pytest

from apps.receiver import cron, run_keys
from apps.receiver.dispatch import job_specs
from apps.receiver.hooks.base import Actor, ForgeEvent
from apps.receiver.matching import Match
from apps.receiver.models import Trigger
from apps.receiver.validation import FIELD_PATHS, entry_from_trigger, entry_problems, fields_from_entry
from apps.worker.jobs import JobSpec

pytestmark = pytest.mark.django_db

LABEL = {"type": "label", "any": ["pi"]}
CRON = {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"}
BASE = {
    "github": {"kind": "github", "flow": "fix-bug"},
    "azure": {"kind": "azure", "flow": "fix-bug", "repository": "api"},
    "cron": {"kind": "local", "folder": "/srv/app", "flow": "tidy", "task": "Tidy up."},
}
# key: (the rule it is set on, what the run becomes with it, what the JobSpec's field then holds)
SAMPLES = {
    "kind": ("github", {"kind": "gitlab"}, "gitlab"),
    "folder": ("cron", {"folder": "/srv/other"}, "/srv/other"),
    "flow": ("github", {"flow": "write-docs"}, "write-docs"),
    "command": ("github", {"flow": None, "command": "triage"}, "triage"),
    "task": ("cron", {"task": "Upgrade the linter."}, "Upgrade the linter."),
    "instructions": ("github", {"instructions": "Keep it small."}, "Keep it small."),
    "repository": ("azure", {"repository": "web"}, "acme/web"),
    "provider": ("github", {"provider": "openrouter"}, "openrouter"),
    "model": ("github", {"model": "claude-haiku-4-5"}, "claude-haiku-4-5"),
    "models": ("github", {"models": ["anthropic/claude-sonnet-4-5"]}, ("anthropic/claude-sonnet-4-5",)),
    "maxTurns": ("github", {"maxTurns": 7}, 7),
    "maxCostUsd": ("github", {"maxCostUsd": "0.5"}, "0.500000"),
    "replicas": ("github", {"replicas": 2}, 2),
    "waitFor": ("github", {"waitFor": [{"profile": "ci-green"}]}, ({"profile": "ci-green"},)),
    "resume": ("cron", {"resume": True}, True),
    "github": ("cron", {"github": True}, True),
    "allowCiChanges": ("github", {"allowCiChanges": True}, True),
    "publishTo": ("github", {"publishTo": "origin"}, "origin"),
    "image": ("github", {"image": "pi-job:next"}, "pi-job:next"),
    "backend": ("github", {"backend": "local"}, "local"),
    "packages": ("cron", {"packages": False}, False),
    "skillsDir": ("github", {"skillsDir": "/srv/skills/review"}, "/srv/skills/review"),
    "excludeTools": ("cron", {"excludeTools": ["bash"]}, ("bash",)),
    "secrets": ("github", {"secrets": {"NPM_TOKEN": "npm/ci"}}, {"NPM_TOKEN": "npm/ci"}),
    "secretsProfile": ("github", {"secrets": {"NPM_TOKEN": "npm/ci"}, "secretsProfile": "vault"}, "vault"),
}


@pytest.fixture(autouse=True)
def skills_roots(settings):
    settings.PI_SKILLS_ROOTS = ("/srv",)


def stored(base: str, changes: dict) -> tuple[dict, Trigger]:
    run = {key: value for key, value in {**BASE[base], **changes}.items() if value is not None}
    entry = {"on": CRON if base == "cron" else LABEL, "run": run}
    problems, dropped = entry_problems(entry)
    assert (problems, dropped) == ([], []), problems
    return run, Trigger.objects.create(**fields_from_entry(entry))


def first_job(trigger: Trigger) -> JobSpec:
    if trigger.on_type == "cron":
        spec = cron.cron_job_spec(trigger, datetime(2026, 12, 3, 3, tzinfo=UTC))
    else:
        azure = trigger.kind == "azure"
        event = ForgeEvent(forge=trigger.kind, delivery_id="d-1", event="issues", action="labeled", route="label",
                           actor=Actor(id="7"), repo="" if azure else "acme/web", project="acme" if azure else "",
                           repo_from_rule=azure, target_type="issue", number=3, labels=("pi",))
        spec = job_specs(event, Match(trigger=trigger, matched={}, flow=trigger.flow, command=trigger.command))[0]
    return JobSpec.from_payload(spec.to_payload())  # as the worker reads it from the queue


def test_every_declared_key_has_a_sample_here():
    assert set(SAMPLES) == set(run_keys.BY_NAME)


@pytest.mark.parametrize("name", list(SAMPLES))
def test_a_declared_key_is_stored_exported_as_written_and_reaches_the_job(name):
    key = run_keys.BY_NAME[name]
    base, changes, expected = SAMPLES[name]
    before = first_job(stored(base, {})[1])
    run, trigger = stored(base, changes)
    after = first_job(trigger)

    assert entry_from_trigger(trigger)["run"] == run
    assert getattr(after, key.job) == expected != getattr(before, key.job)


def test_every_trigger_field_of_the_run_is_a_declared_key_and_the_reverse():
    run_fields = {field.name for field in Trigger._meta.get_fields()
                  if str(getattr(field, "verbose_name", "")).startswith("run.")}
    assert run_fields | {"kind"} == set(run_keys.BY_FIELD)  # `run.kind` is the "forge" column of the admin's lists
    for key in run_keys.RUN_KEYS:
        assert Trigger._meta.get_field(key.field).verbose_name in (key.path, "forge")
        assert FIELD_PATHS[key.path] == key.field
        assert key.job in JobSpec.__dataclass_fields__, key.name
        assert key.label and key.help, key.name


def test_the_documentation_of_the_run_keys_is_what_their_declaration_makes():
    from devtools import run_keys_doc

    assert run_keys_doc.DOCUMENT.read_text() == run_keys_doc.render(), "run: python -m devtools.run_keys_doc"
