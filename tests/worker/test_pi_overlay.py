"""The operator's pi overlay (PI_GLOBAL_PI_DIR), `run.packages: false` and `manage.py import_pi` (issue 29 §2): what pi
in the job loads, and never a key. A trigger's skills folder (`run.skillsDir`): tests/worker/test_skills_folder.py."""

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.worker.sandbox import pi_overlay
from tests.jobspecs import local_spec

ANTHROPIC_KEY = "sk-ant-api03-" + "A1b2C3d4" * 6


def skill(folder: Path, name: str, description: str) -> Path:
    (folder / name).mkdir(parents=True)
    (folder / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n\nDo {name}.\n")
    return folder / name


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
    settings.PI_SKILLS_ROOTS = (str(tmp_path / "overlay"),)
    settings.PI_GLOBAL_PI_DIR = str(overlay_with_package(tmp_path / "overlay"))
    settings.PI_GLOBAL_ALLOW_EXTENSIONS = False
    job = tmp_path / "job"
    job.mkdir()
    pi_overlay.prepare(job, packages=True, skills_dir=str(tmp_path / "overlay" / "skills"))
    assert resources(job) == {"extensions": [], "promptTemplates": [], "skills": [
        "/opt/pi-global/skills", "/opt/pi-global/packages/demo-pack/skills", "/job/trigger-skills"]}


def test_without_an_overlay_the_job_gets_only_its_triggers_skills(tmp_path, settings):
    settings.PI_SKILLS_ROOTS = (str(tmp_path),)
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


def test_import_pi_takes_every_credential_out_of_models_json_and_names_where(tmp_path):
    """Every job can read the overlay: a credential in a base URL, a model's headers or a field pi does not know
    would reach each of them."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "models.json").write_text(json.dumps({"providers": {"corp": {
        "baseUrl": "https://svc:hunter2-pass@llm.example.com:8443/v1?api-key=QUERYKEY#frag",
        "api": "openai-completions",
        "models": [{"id": "corp-large", "baseUrl": "https://llm.example.com/v2?token=MODELTOKEN",
                    "headers": {"X-Api-Key": "MODELHEADER"}, "contextWindow": 128000, "secretNote": "NOTEKEY"}],
        "modelOverrides": {"corp-small": {"headers": {"Authorization": "OVERRIDEHEADER"}, "maxTokens": 4096}},
        "password": "PROVIDERPASS"}}, "extra": {"token": "TOPTOKEN"}}))
    overlay = tmp_path / "overlay"

    out, _ = import_pi("--from", str(agent), "--to", str(overlay))

    models = json.loads((overlay / "models.json").read_text())
    assert models == {"providers": {"corp": {
        "baseUrl": "https://llm.example.com:8443/v1", "api": "openai-completions",
        "models": [{"id": "corp-large", "baseUrl": "https://llm.example.com/v2", "contextWindow": 128000}],
        "modelOverrides": {"corp-small": {"maxTokens": 4096}}}}}
    staged = (overlay / "models.json").read_bytes()
    for secret in (b"hunter2", b"QUERYKEY", b"MODELTOKEN", b"MODELHEADER", b"NOTEKEY", b"OVERRIDEHEADER",
                   b"PROVIDERPASS", b"TOPTOKEN", b"svc"):
        assert secret not in staged
    # Each removal is named (where, which field), never its value.
    for said in ("providers.corp.baseUrl's user info and query and fragment",
                 "providers.corp.models[corp-large].baseUrl's query", "providers.corp.models[corp-large].headers",
                 "providers.corp.models[corp-large].secretNote (not a field pi knows here)",
                 "providers.corp.modelOverrides[corp-small].headers", "providers.corp.password",
                 "models.json: extra (not a field of pi's models.json)"):
        assert said in out, said
    assert "hunter2" not in out and "QUERYKEY" not in out and "MODELHEADER" not in out


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
