"""The operator's pi overlay (PI_GLOBAL_PI_DIR), a trigger's skills folder (`run.skillsDir`), `run.packages: false`
and `manage.py import_pi` (issue 29 §2): what pi in the job loads, within the bounds of the repository's `.pi/`
copy, and never a key."""

import json
import stat
import tempfile
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.worker.models import Outcome, Run
from apps.worker.sandbox import pi_overlay, repo_skills
from apps.worker.sandbox.workspace import WorkspaceRefused
from tests.jobspecs import enqueue_spec, local_spec
from tests.local_repos import local_root

ANTHROPIC_KEY = "sk-ant-api03-" + "A1b2C3d4" * 6


def skill(folder: Path, name: str, description: str) -> Path:
    (folder / name).mkdir(parents=True)
    (folder / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n\nDo {name}.\n")
    return folder / name


@pytest.fixture
def shared_folder():
    """A folder the job's user can read (pytest's temp folders are root-only)."""
    base = Path(tempfile.mkdtemp(prefix="pidispatch-overlay-", dir=local_root()))
    base.chmod(0o755)
    yield base
    import shutil
    shutil.rmtree(base, ignore_errors=True)


# --- run.skillsDir: the `.pi/` copy's bounds -----------------------------------------------------------------------

def test_a_skills_folder_is_copied_without_links_dot_files_or_executable_bits(tmp_path):
    source = tmp_path / "skills"
    skill(source, "review", "Reviews a change.")
    (source / "review" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (source / "review" / "run.sh").chmod(0o755)
    (source / ".hidden").write_text("no")
    (source / "review" / "passwd").symlink_to("/etc/passwd")
    (source / "elsewhere").symlink_to(tmp_path)

    copied = pi_overlay.copy_skills_folder(source, tmp_path / "job" / "trigger-skills")

    target = tmp_path / "job" / "trigger-skills"
    assert copied == 2
    assert sorted(str(path.relative_to(target)) for path in target.rglob("*")) == \
        ["review", "review/SKILL.md", "review/run.sh"]
    assert stat.S_IMODE((target / "review" / "run.sh").stat().st_mode) == 0o644  # a plain file, never executable


@pytest.mark.parametrize("make, reason", [
    (lambda root: (root / "a" / "b" / "c" / "d").mkdir(parents=True) or (root / "a/b/c/d/e.md").write_text("x"),
     "skills-dir-too-deep"),
    (lambda root: (root / "big.md").write_bytes(b"x" * (repo_skills.MAX_FILE_BYTES + 1)), "skills-dir-file-too-large"),
    (lambda root: [(root / f"f{i}.md").write_text("x") for i in range(repo_skills.MAX_FILES + 1)],
     "skills-dir-too-many-files"),
    (lambda root: [(root / f"f{i}.md").write_bytes(b"x" * repo_skills.MAX_FILE_BYTES) for i in range(9)],
     "skills-dir-too-large"),
])
def test_a_skills_folder_past_a_bound_is_refused_naming_it(tmp_path, make, reason):
    source = tmp_path / "skills"
    source.mkdir()
    make(source)
    with pytest.raises(WorkspaceRefused) as refused:
        pi_overlay.copy_skills_folder(source, tmp_path / "copy")
    assert refused.value.reason == reason
    assert not (tmp_path / "copy").exists()  # nothing half-copied


def test_a_missing_skills_folder_or_a_link_to_one_is_skills_dir_missing(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("x")
    for source in (tmp_path / "absent", tmp_path / "link", tmp_path / "file"):
        with pytest.raises(WorkspaceRefused) as refused:
            pi_overlay.copy_skills_folder(source, tmp_path / "copy")
        assert refused.value.reason == "skills-dir-missing"


# --- the overlay as pi's settings.json sees it ------------------------------------------------------------------------

def overlay_with_package(root: Path) -> Path:
    skill(root / "skills", "overlay-greeter", "Greets from the operator's overlay.")
    (root / "extensions").mkdir()
    (root / "extensions" / "hello.ts").write_text("export default function () {}\n")
    package = root / "packages" / "demo-pack"
    skill(package / "skills", "staged-pack-helper", "Helps, from a staged package.")
    (package / "package.json").write_text(json.dumps({"name": "demo-pack", "pi": {"skills": ["./skills"]}}))
    (root / "APPEND_SYSTEM.md").write_text("Be brief.\n")
    return root


def resources(job: Path) -> dict:
    return json.loads((job / "pi-resources.json").read_text())


def test_the_job_loads_the_overlay_and_its_packages_unless_the_trigger_opts_out(tmp_path, settings):
    settings.PI_GLOBAL_PI_DIR = str(overlay_with_package(tmp_path / "overlay"))
    job = tmp_path / "job"
    job.mkdir()

    loaded = pi_overlay.prepare(job, packages=True, skills_dir="")
    # Both as pi packages (-e): the overlay's own skills/, prompts/ and extensions/, and the staged package.
    assert resources(job) == {"extensions": ["/opt/pi-global", "/opt/pi-global/packages/demo-pack"], "skills": [],
                              "promptTemplates": []}
    assert loaded.environment() == {"PI_PACKAGES": "/opt/pi-global/packages/demo-pack"}
    assert loaded.mounts() == [(str(tmp_path / "overlay"), "/opt/pi-global")]
    assert (job / "pi-agent" / "APPEND_SYSTEM.md").read_text() == "Be brief.\n"

    opted_out = pi_overlay.prepare(job, packages=False, skills_dir="")
    assert resources(job)["extensions"] == ["/opt/pi-global"]
    assert opted_out.environment() == {}  # PI_PACKAGES unset in the job


def test_extensions_stay_out_when_the_host_does_not_allow_them(tmp_path, settings):
    settings.PI_GLOBAL_PI_DIR = str(overlay_with_package(tmp_path / "overlay"))
    settings.PI_GLOBAL_ALLOW_EXTENSIONS = False
    job = tmp_path / "job"
    job.mkdir()
    pi_overlay.prepare(job, packages=True, skills_dir=str(tmp_path / "overlay" / "skills"))
    assert resources(job) == {"extensions": [], "promptTemplates": [], "skills": [
        "/opt/pi-global/skills", "/opt/pi-global/packages/demo-pack/skills", "/job/trigger-skills"]}


def test_without_an_overlay_the_job_gets_only_its_triggers_skills(tmp_path, settings):
    settings.PI_GLOBAL_PI_DIR = str(tmp_path / "not-there")
    skill(tmp_path / "skills", "review", "Reviews.")
    job = tmp_path / "job"
    job.mkdir()
    loaded = pi_overlay.prepare(job, packages=True, skills_dir=str(tmp_path / "skills"))
    assert resources(job) == {"extensions": [], "skills": ["/job/trigger-skills"], "promptTemplates": []}
    assert (loaded.mounts(), loaded.environment()) == ([], {})
    assert (job / "trigger-skills" / "review" / "SKILL.md").exists()


def test_a_chained_child_loads_what_its_parent_loaded():
    from apps.worker.chaining import outbox
    from apps.worker.chaining.service import child_spec

    parent = local_spec("run-parent", "/srv/app", skills_dir="/srv/skills", packages=False, backend="local")
    child = child_spec(parent, outbox.Request(name="request-1.json", flow="review", task="Review it."))
    assert (child.skills_dir, child.packages, child.backend) == ("/srv/skills", False, "local")


# --- manage.py import_pi ---------------------------------------------------------------------------------------------

def import_pi(*args):
    out, err = StringIO(), StringIO()
    call_command("import_pi", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_import_pi_stages_the_setup_and_never_a_key(tmp_path):
    agent = tmp_path / "agent"
    skill(agent / "skills", "tidy", "Tidies.")
    leaky = skill(agent / "skills", "deploy", "Deploys.")
    (leaky / "SKILL.md").write_text("---\nname: deploy\ndescription: d\n---\n"
                                    f"export ANTHROPIC_API_KEY={ANTHROPIC_KEY}\n")
    (agent / "auth.json").write_text(json.dumps({"anthropic": {"type": "api_key", "key": ANTHROPIC_KEY}}))
    (agent / "models.json").write_text(json.dumps({"providers": {"corp": {
        "baseUrl": "https://llm.example.com/v1", "apiKey": "CORP_KEY", "headers": {"x-token": "t0k"},
        "models": [{"id": "corp-large"}]}}}))
    (agent / "AGENTS.md").write_text("You are careful.\n")
    (agent / "sessions").mkdir()
    (agent / "sessions" / "s.jsonl").write_text("{}\n")
    local_package = tmp_path / "my-pack"
    skill(local_package / "skills", "pack-skill", "From a local package.")
    (agent / "settings.json").write_text(json.dumps({"packages": [str(local_package), "npm:pi-skills"]}))
    overlay = tmp_path / "overlay"

    out, err = import_pi("--from", str(agent), "--to", str(overlay))

    assert (overlay / "skills" / "tidy" / "SKILL.md").exists()
    assert not (overlay / "skills" / "deploy" / "SKILL.md").exists()
    assert "refused  skills/deploy/SKILL.md: holds something shaped like a credential" in err
    assert not (overlay / "auth.json").exists() and not (overlay / "sessions").exists()
    assert "skipped  auth.json" in out
    models = json.loads((overlay / "models.json").read_text())
    assert models == {"providers": {"corp": {"baseUrl": "https://llm.example.com/v1",
                                             "models": [{"id": "corp-large"}]}}}
    assert "stripped models.json: providers.corp.apiKey" in out and "providers.corp.headers" in out
    assert (overlay / "AGENTS.md").read_text() == "You are careful.\n"
    assert (overlay / "packages" / "my-pack" / "skills" / "pack-skill" / "SKILL.md").exists()
    assert "skipped  package npm:pi-skills: not a local folder" in out
    staged = b"".join(path.read_bytes() for path in overlay.rglob("*") if path.is_file())
    assert ANTHROPIC_KEY.encode() not in staged and b"t0k" not in staged and b"CORP_KEY" not in staged


def test_import_pi_replaces_what_it_staged_before(tmp_path):
    agent = tmp_path / "agent"
    skill(agent / "skills", "old", "Old.")
    overlay = tmp_path / "overlay"
    import_pi("--from", str(agent), "--to", str(overlay))
    (agent / "skills" / "old" / "SKILL.md").unlink()
    (agent / "skills" / "old").rmdir()
    skill(agent / "skills", "new", "New.")
    import_pi("--from", str(agent), "--to", str(overlay))
    assert sorted(path.name for path in (overlay / "skills").iterdir()) == ["new"]


def test_import_pi_needs_a_source_and_an_overlay(tmp_path, settings):
    settings.PI_GLOBAL_PI_DIR = ""
    with pytest.raises(CommandError, match="set PI_GLOBAL_PI_DIR"):
        import_pi("--from", str(tmp_path))
    with pytest.raises(CommandError, match="is not a folder"):
        import_pi("--from", str(tmp_path / "absent"), "--to", str(tmp_path / "overlay"))
    with pytest.raises(CommandError, match="cannot be inside"):
        import_pi("--from", str(tmp_path), "--to", str(tmp_path / "overlay"))


# --- the worker: refusals before any spend ---------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_missing_skills_folder_refuses_the_job_before_it_spends(repo, run_worker):
    job_id = enqueue_spec(local_spec("run-skills-missing", str(repo), skills_dir="/nonexistent/skills"))
    run_worker("pi-jobs")
    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "skills-dir-missing", False)

