"""The real pi in the production image (PI_REAL_JOB_IMAGE) loads the operator's overlay (PI_GLOBAL_PI_DIR) and a
trigger's skills folder (`run.skillsDir`), and leaves the overlay's staged packages out when the trigger says
`run.packages: false` (issue 29 §2). What pi loaded is read where it tells its model: the skills it lists in the
system prompt of its first call to the scripted provider, behind the job's egress gateway."""

import json
import os
from pathlib import Path

import pytest

from apps.worker.models import Outcome, Run
from devtools.scripted_provider import ScriptedProvider, Text, ToolCall
from tests.jobspecs import enqueue_spec, local_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

MODEL_KEY = "sk-ant-real-provider-key-0123456789"


@pytest.fixture
def model():
    server = ScriptedProvider(key=MODEL_KEY)
    yield server
    server.close()


def skill(folder: Path, name: str, description: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n\nDo {name}.\n")


def readable(root: Path) -> Path:
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def test_the_real_pi_lists_the_overlays_and_the_triggers_skills_and_packages_only_when_loaded(
        repo, run_worker, model, owner_space, skills_space):
    overlay = owner_space / "overlay"
    skill(overlay / "skills", "overlay-greeter", "Greets from the operator's overlay.")
    package = overlay / "packages" / "demo-pack"
    skill(package / "skills", "staged-pack-helper", "Helps, from a staged package.")
    (package / "package.json").write_text(json.dumps({"name": "demo-pack", "version": "1.0.0",
                                                      "pi": {"skills": ["./skills"]}}))
    readable(overlay)
    skills_dir = skills_space / "trigger-skills"
    skill(skills_dir, "trigger-reviewer", "Reviews, from the trigger's own skills folder.")
    readable(skills_dir)
    model.scenarios["skills"] = [ToolCall("bash", {"command": "echo packages=[$PI_PACKAGES]"}), Text("Listed.")]
    loaded = enqueue_spec(local_spec("run-overlay-on", str(repo), task="ALPHA scripted:skills",
                                     skills_dir=str(skills_dir), force=True))
    opted_out = enqueue_spec(local_spec("run-overlay-off", str(repo), task="BETA scripted:skills",
                                        skills_dir=str(skills_dir), packages=False, force=True))

    run_worker("pi-jobs", env_overrides={
        "PI_JOB_IMAGE": os.environ["PI_REAL_JOB_IMAGE"], "PI_PROVIDER": "anthropic",
        "PI_PROVIDER_BASE_URL": model.url, "ANTHROPIC_API_KEY": MODEL_KEY, "PI_MODEL": "claude-sonnet-4-5",
        "PI_JOB_MEMORY": "1g", "PI_GLOBAL_PI_DIR": str(overlay)}, timeout=300)

    for job_id in (loaded, opted_out):
        run = Run.objects.get(job_id=job_id)
        assert (run.outcome, run.reason) == (Outcome.COMPLETED, ""), (job_id, run.reason)
    calls = {word: [seen.body for seen in model.seen if word in seen.body] for word in ("ALPHA", "BETA")}
    first, last = calls["ALPHA"][0], calls["ALPHA"][-1]
    assert "overlay-greeter" in first and "trigger-reviewer" in first and "staged-pack-helper" in first
    assert "packages=[/opt/pi-global/packages/demo-pack]" in last
    first, last = calls["BETA"][0], calls["BETA"][-1]
    assert "overlay-greeter" in first and "trigger-reviewer" in first
    assert "staged-pack-helper" not in first
    assert "packages=[]" in last  # PI_PACKAGES unset in the job
