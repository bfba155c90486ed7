"""The provider's credential must be there before any spend, and never reaches the container: the job's
egress gateway adds it to the provider calls (tests/worker/test_egress_gateway.py, tests/worker/test_real_pi.py)."""

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


def test_the_triggers_provider_is_named_and_no_key_enters_the_container(run_worker, settings):
    job_id = enqueue_spec(forge_spec("gh-openai", provider="openai", model="gpt-x", body="fake-agent:report"))

    run_worker("pi-jobs", env_overrides={"OPENAI_API_KEY": "sk-openai-test"})

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    report = json.loads((Path(settings.PI_JOB_ROOT) / job_id / "workspace" / "sandbox-report.json").read_text())
    names = set(report["env_names"].split())
    assert {"PI_PROVIDER", "PI_MODEL", "HTTPS_PROXY", "PI_CODING_AGENT_DIR"} <= names
    assert not names & {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
    models = json.loads((Path(settings.PI_JOB_ROOT) / job_id / "job" / "pi-agent" / "models.json").read_text())
    assert models == {"providers": {"openai": {"baseUrl": "http://127.0.0.1:8080/v1",
                                               "apiKey": "pidispatch-gateway-adds-the-key",
                                               "api": "openai-responses", "models": [{"id": "gpt-x"}]}}}


def test_an_unknown_provider_needs_its_variable_and_its_endpoint(run_worker):
    job_id = enqueue_spec(forge_spec("gh-custom", provider="acme-llm"))

    refused = run_worker("pi-jobs")
    assert Run.objects.get(job_id=job_id).reason == "provider-unconfigured"
    assert "provider=acme-llm variable=- upstream=unknown" in refused.stderr + refused.stdout

    keyed = enqueue_spec(forge_spec("gh-custom2", provider="acme-llm", number=8))
    refused = run_worker("pi-jobs", env_overrides={"PI_PROVIDER_KEY_VARS": "acme-llm:ACME_TOKEN", "ACME_TOKEN": "t"})
    assert Run.objects.get(job_id=keyed).reason == "provider-unconfigured"  # a key, but where would it go?
    assert "provider=acme-llm variable=ACME_TOKEN upstream=unknown" in refused.stderr + refused.stdout

    served = enqueue_spec(forge_spec("gh-custom3", provider="acme-llm", number=9))
    run_worker("pi-jobs", env_overrides={"PI_PROVIDER_KEY_VARS": "acme-llm:ACME_TOKEN", "ACME_TOKEN": "t",
                                         "PI_PROVIDER": "acme-llm", "PI_MODEL": "coder-1",
                                         "PI_PROVIDER_BASE_URL": "https://llm.acme.example/v1",
                                         "PI_PROVIDER_API": "openai-completions"})
    assert Run.objects.get(job_id=served).outcome == Outcome.COMPLETED


def test_a_model_without_a_price_is_refused_before_spend_under_a_dollar_cap(run_worker, tmp_path):
    """Its calls could not be bounded in dollars: refused at the gates, before the container and its hold."""
    custom = {"PI_PROVIDER_KEY_VARS": "acme-llm:ACME_TOKEN", "ACME_TOKEN": "t", "PI_PROVIDER": "acme-llm",
              "PI_MODEL": "coder-1", "PI_PROVIDER_BASE_URL": "https://llm.acme.example/v1",
              "PI_PROVIDER_API": "openai-completions", "PI_MAX_COST_USD": "1", "PI_DAILY_COST_USD": "5"}
    refused = enqueue_spec(forge_spec("gh-unpriced", provider="acme-llm"))
    run_worker("pi-jobs", env_overrides=custom)
    run = Run.objects.get(job_id=refused)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "model-unpriced", False)
    assert run.dollar_basis == "refunded"

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"acme-llm/coder-1": {"input": 1, "output": 2}}))
    priced = enqueue_spec(forge_spec("gh-priced", provider="acme-llm", number=8))
    run_worker("pi-jobs", env_overrides={**custom, "PI_MODEL_PRICES": str(prices)})
    assert Run.objects.get(job_id=priced).outcome == Outcome.COMPLETED
