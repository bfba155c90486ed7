"""`run.packages`, `run.skillsDir`, `run.github` and `run.backend` (issue 29 §2, §3): an ancestor's file that uses
them imports, means the same, reaches its jobs, and exports again; a bad value is named by its field."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from apps.receiver import cron
from apps.receiver.models import Trigger
from apps.receiver.run_keys import job_fields
from apps.receiver.validation import entry_problems
from apps.worker.jobs import JobSpec

pytestmark = pytest.mark.django_db

LABEL = {"type": "label", "any": ["pi"]}
GITHUB = {"kind": "github", "flow": "fix-bug"}
CRON = {"type": "cron", "id": "nightly", "pattern": "0 3 * * *"}
LOCAL = {"kind": "local", "folder": "/srv/app", "flow": "tidy", "task": "Tidy up."}


@pytest.fixture(autouse=True)
def skills_roots(settings):
    settings.PI_SKILLS_ROOTS = ("/srv",)  # where these rules' skills folders are (judged at save)


def problems(on, run):
    found, _ = entry_problems({"on": on, "run": run})
    return [(problem.path, problem.message) for problem in found]


def refused(on, run, path, fragment):
    found = problems(on, run)
    assert any(p == path and fragment in message for p, message in found), found


def import_file(tmp_path, entries):
    (tmp_path / "t.json").write_text(json.dumps({"triggers": entries}))
    out = StringIO()
    call_command("import_triggers", str(tmp_path / "t.json"), stdout=out, stderr=StringIO())
    return out.getvalue()


def export_file():
    out = StringIO()
    call_command("export_triggers", stdout=out)
    return json.loads(out.getvalue())["triggers"]


def test_the_four_keys_are_accepted_where_the_ancestor_accepts_them():
    assert problems(LABEL, {**GITHUB, "packages": False, "skillsDir": "/srv/skills", "backend": "local"}) == []
    assert problems(CRON, {**LOCAL, "github": True, "packages": True, "skillsDir": "/srv/s", "backend": "podman"}) == []


@pytest.mark.parametrize("on, run, path, fragment", [
    (LABEL, {**GITHUB, "packages": "no"}, "run.packages", "must be true or false"),
    (CRON, {**LOCAL, "github": 1}, "run.github", "must be true or false"),
    (LABEL, {**GITHUB, "github": True}, "run.github", "only for cron triggers"),
    (LABEL, {**GITHUB, "skillsDir": " /srv/skills"}, "run.skillsDir", "absolute folder"),
    (LABEL, {**GITHUB, "skillsDir": "skills"}, "run.skillsDir", "absolute folder"),
    (LABEL, {**GITHUB, "skillsDir": ""}, "run.skillsDir", "absolute folder"),
    (LABEL, {**GITHUB, "backend": "docker"}, "run.backend", "'docker' is not a known venue; known: local, podman"),
    (LABEL, {**GITHUB, "backend": "Local "}, "run.backend", "must be a venue name"),
    (CRON, {**LOCAL, "backends": "local"}, "run.backends", "did you mean run.backend"),
    (LABEL, {**GITHUB, "publishTo": "elsewhere"}, "run.publishTo", "must be fork (the deployment's fork) or origin"),
    (LABEL, {**GITHUB, "publishTo": True}, "run.publishTo", "must be fork"),
    (CRON, {**LOCAL, "publishTo": "fork"}, "run.publishTo", "is for forge triggers"),
])
def test_a_bad_value_is_named_by_its_field(on, run, path, fragment):
    refused(on, run, path, fragment)


def test_an_ancestor_file_with_the_four_keys_round_trips_and_reaches_the_jobs(tmp_path):
    entries = [
        {"on": LABEL, "run": {**GITHUB, "packages": False, "skillsDir": "/srv/skills/review", "backend": "local"}},
        {"on": CRON, "run": {**LOCAL, "github": True, "skillsDir": "/srv/skills/nightly"}},
    ]
    import_file(tmp_path, entries)
    forge_rule, cron_rule = Trigger.objects.order_by("position")
    assert (forge_rule.packages, forge_rule.skills_dir, forge_rule.backend) == (False, "/srv/skills/review", "local")
    assert (cron_rule.packages, cron_rule.github, cron_rule.backend) == (True, True, "")
    assert [entry["run"] for entry in export_file()] == [entry["run"] for entry in entries]

    fields = job_fields(forge_rule)
    assert (fields["packages"], fields["skills_dir"], fields["backend"]) == (False, "/srv/skills/review", "local")
    from datetime import UTC, datetime
    spec = cron.cron_job_spec(cron_rule, datetime(2026, 12, 3, 3, tzinfo=UTC))
    assert (spec.github, spec.packages, spec.skills_dir) == (True, True, "/srv/skills/nightly")
    # What a worker reads back is what was queued.
    assert JobSpec.from_payload(spec.to_payload()) == spec


def test_a_payload_without_the_new_fields_is_the_one_an_older_worker_reads():
    spec = JobSpec(job_id="gh-1", kind="github", repo="acme/web", flow="fix-bug")
    payload = spec.to_payload()
    assert not {"packages", "skills_dir", "github", "backend"} & set(payload)
    opted_out = JobSpec(job_id="gh-2", kind="github", repo="acme/web", flow="fix-bug", packages=False)
    assert opted_out.to_payload()["packages"] is False
    assert JobSpec.from_payload(opted_out.to_payload()).packages is False


def test_where_the_work_is_pushed_round_trips_and_reaches_the_job(tmp_path):
    entries = [{"on": LABEL, "run": {**GITHUB, "publishTo": "fork"}},
               {"on": LABEL, "run": {**GITHUB, "publishTo": "origin"}}, {"on": LABEL, "run": GITHUB}]
    import_file(tmp_path, entries)
    assert list(Trigger.objects.order_by("position").values_list("publish_to", flat=True)) == ["fork", "origin", ""]
    assert [entry["run"] for entry in export_file()] == [entry["run"] for entry in entries]
    spec = JobSpec(job_id="gh-1", kind="github", repo="acme/web", flow="fix-bug", publish_to="fork")
    assert JobSpec.from_payload(spec.to_payload()).publish_to == "fork"
    assert "publish_to" not in JobSpec(job_id="gh-2", kind="github", repo="acme/web", flow="x").to_payload()
