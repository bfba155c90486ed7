"""The provider's credential must be there before any spend, and reaches the container under the
provider's own variable name and nowhere else."""

import json
from pathlib import Path

import pytest

from apps.worker.models import Outcome, Run
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_missing_key_refuses_before_spend(run_worker, worker_env):
    job_id = enqueue_spec(forge_spec("gh-nokey"))

    run_worker("pi-jobs", env_overrides={"ANTHROPIC_API_KEY": ""})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "provider-unconfigured", False)


def test_the_triggers_provider_gets_only_its_own_key(run_worker, settings):
    job_id = enqueue_spec(forge_spec("gh-openai", provider="openai", model="gpt-x", body="fake-agent:report"))

    run_worker("pi-jobs", env_overrides={"OPENAI_API_KEY": "sk-openai-test"})

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    report = json.loads((Path(settings.PI_JOB_ROOT) / job_id / "workspace" / "sandbox-report.json").read_text())
    names = set(report["env_names"].split())
    assert {"OPENAI_API_KEY", "PI_PROVIDER", "PI_MODEL"} <= names
    assert "ANTHROPIC_API_KEY" not in names


def test_an_unknown_provider_can_be_mapped_to_its_variable(run_worker):
    job_id = enqueue_spec(forge_spec("gh-custom", provider="acme-llm"))

    refused = run_worker("pi-jobs")
    assert Run.objects.get(job_id=job_id).reason == "provider-unconfigured"
    assert "provider=acme-llm" in refused.stderr + refused.stdout

    retry = enqueue_spec(forge_spec("gh-custom2", provider="acme-llm", number=8))
    run_worker("pi-jobs", env_overrides={"PI_PROVIDER_KEY_VARS": "acme-llm:ACME_TOKEN", "ACME_TOKEN": "t"})
    assert Run.objects.get(job_id=retry).outcome == Outcome.COMPLETED
