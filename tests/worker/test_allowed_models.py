"""The allowed-model list (`run.models`, PI_ALLOWED_MODELS): the job's egress gateway forwards only the listed
models and meters each on its own row, the worker refuses before any spend what the list forbids or cannot price,
and the container's pi is given the list. The gateway tests attack the real gateway on its unix socket in front of
the local scripted provider (devtools/scripted_provider.py); the worker tests run real workers and the demo image.
The real pi receiving the list: tests/worker/test_real_pi.py."""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from apps.worker.models import Outcome, Run
from apps.worker.sandbox import gateway, prices
from apps.worker.sandbox.metering import Usage
from devtools.scripted_provider import ScriptedProvider
from tests.egress_support import PROVIDER_KEY, post, running_gateway, upstream_for
from tests.jobspecs import enqueue_spec, forge_spec

SONNET, HAIKU, OPUS = "claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1"  # three prices in pi's list
LISTED = gateway.Limits(allowed_models=frozenset({SONNET, HAIKU}))


@pytest.fixture
def provider():
    server = ScriptedProvider(key=PROVIDER_KEY)
    yield server
    server.close()


def anthropic_body(model: str) -> bytes:
    return json.dumps({"model": model, "max_tokens": 256, "stream": True,
                       "messages": [{"role": "user", "content": "Fix the footer."}]}).encode()


# --- the gateway ---------------------------------------------------------------------------------------------

def test_a_call_for_a_model_off_the_list_is_refused_logged_never_forwarded_and_stops_the_job(
        provider, redis_conn, caplog):
    caplog.set_level(logging.INFO, logger="pidispatch.egress")
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=LISTED) as (egress, stops):
        status, answer = post(egress.provider_socket, "/v1/messages", anthropic_body(OPUS))
        listed_after, _ = post(egress.provider_socket, "/v1/messages", anthropic_body(SONNET))

    assert status == 403 and b"model-not-allowed" in answer
    assert provider.requests == []  # neither the refused call nor any after it reached the provider
    assert listed_after == 403  # the job is stopped: not even a listed model is forwarded now
    assert stops == ["model-not-allowed"] and egress.report.stop_reason == "model-not-allowed"
    assert egress.report.refusals == {"model-not-allowed": 1} and egress.report.spend_by_model() == {}
    assert any("egress_stop job=egress-test reason=model-not-allowed" in record.getMessage()
               for record in caplog.records)


def test_listed_models_are_forwarded_and_each_is_metered_and_priced_on_its_own_row(provider, redis_conn):
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=LISTED) as (egress, stops):
        answers = [post(egress.provider_socket, "/v1/messages", anthropic_body(model))[0]
                   for model in (SONNET, HAIKU, SONNET)]

    assert answers == [200, 200, 200] and stops == []
    assert [json.loads(seen.body)["model"] for seen in provider.seen] == [SONNET, HAIKU, SONNET]
    rows = {row["model"]: row for row in egress.report.meter.telemetry(turns=None).usage["models"]}
    assert set(rows) == {SONNET, HAIKU} and (rows[SONNET]["calls"], rows[HAIKU]["calls"]) == (2, 1)
    spend = egress.report.spend_by_model()
    assert set(spend) == {f"anthropic/{SONNET}", f"anthropic/{HAIKU}"}
    for model, row in rows.items():
        usage = Usage(input=row["input"], output=row["output"], cache_read=row["cacheRead"],
                      cache_write=row["cacheWrite"])
        cost = prices.cost("anthropic", model, usage)  # each row at its own model's price
        assert cost > 0 and Decimal(row["cost"]) == cost.quantize(Decimal("0.000001"))
        share = spend[f"anthropic/{model}"]
        assert (share.calls, share.tokens) == (row["calls"], row["total"])
        assert share.cost_micros == int((cost * 1_000_000).to_integral_value(rounding="ROUND_CEILING"))
    # Same tokens per call, a third of sonnet's price: the rows are not one price spread over the job.
    assert spend[f"anthropic/{SONNET}"].cost_micros > 2 * spend[f"anthropic/{HAIKU}"].cost_micros
    assert spend[f"anthropic/{SONNET}"].as_dict().keys() == {"calls", "tokens", "costMicros"}


def test_the_list_is_read_ignoring_case_and_an_unpriced_listed_model_is_refused_under_a_dollar_cap(
        provider, redis_conn):
    limits = gateway.Limits(allowed_models=frozenset({HAIKU, "house-model"}), max_cost_micros=1_000_000)
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, stops):
        priced, _ = post(egress.provider_socket, "/v1/messages", anthropic_body("Claude-Haiku-4-5"))
        unpriced, answer = post(egress.provider_socket, "/v1/messages", anthropic_body("house-model"))
    assert priced == 200 and unpriced == 403 and b"model-unpriced" in answer
    assert len(provider.requests) == 1 and stops == ["model-unpriced"]


# --- the worker ------------------------------------------------------------------------------------------------

def job_file(settings, job_id: str, *parts: str) -> Path:
    return Path(settings.PI_JOB_ROOT, job_id, *parts)


@pytest.mark.django_db(transaction=True)
def test_the_triggers_list_reaches_pi_in_the_container_with_its_providers_models(run_worker, settings):
    listed = ("anthropic/claude-sonnet-4-5", "anthropic/house-model", "openai/gpt-5")
    job_id = enqueue_spec(forge_spec("gh-listed", models=listed, body="fake-agent:env-to-file=PI_ALLOWED_MODELS"))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    # The job's gateway serves its provider (anthropic): pi chooses among that provider's listed models.
    sent = job_file(settings, job_id, "workspace", "env-PI_ALLOWED_MODELS.txt").read_text()
    assert sent == "anthropic/claude-sonnet-4-5,anthropic/house-model"
    models = json.loads(job_file(settings, job_id, "job", "pi-agent", "models.json").read_text())
    assert models["providers"]["anthropic"]["models"] == [{"id": "house-model"}]  # pi's registry lacks it


@pytest.mark.django_db(transaction=True)
def test_the_deployments_list_applies_unless_the_trigger_has_its_own(run_worker, settings):
    deployment = {"PI_ALLOWED_MODELS": "anthropic/claude-haiku-4-5,anthropic/claude-sonnet-4-5"}
    plain = enqueue_spec(forge_spec("gh-plain", body="fake-agent:env-to-file=PI_ALLOWED_MODELS"))
    own = enqueue_spec(forge_spec("gh-own", number=8, models=("anthropic/claude-opus-4-1",),
                                  body="fake-agent:env-to-file=PI_ALLOWED_MODELS"))
    run_worker("pi-jobs", env_overrides=deployment)
    unlisted = enqueue_spec(forge_spec("gh-unlisted", number=9, body="fake-agent:env-to-file=PI_ALLOWED_MODELS"))
    run_worker("pi-jobs")  # no list at all: nothing is passed

    assert {run.job_id: run.outcome for run in Run.objects.all()} == {
        plain: Outcome.COMPLETED, own: Outcome.COMPLETED, unlisted: Outcome.COMPLETED}
    read = lambda job_id: job_file(settings, job_id, "workspace", "env-PI_ALLOWED_MODELS.txt").read_text()  # noqa
    assert read(plain) == deployment["PI_ALLOWED_MODELS"]
    assert read(unlisted) == ""
    assert read(own) == "anthropic/claude-opus-4-1"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fields, overrides", [
    ({"model": OPUS, "models": ("anthropic/claude-sonnet-4-5",)}, {}),  # the main model is off the list
    ({"models": ("openai/gpt-5",)}, {}),  # no model of the job's provider on it: nothing could be called
    ({}, {"PI_ALLOWED_MODELS": "openai/gpt-5,openai/gpt-5-mini"}),  # the deployment's list, the same
])
def test_what_the_list_forbids_is_refused_before_any_spend(fields, overrides, run_worker, settings):
    job_id = enqueue_spec(forge_spec("gh-forbidden", **fields))

    worker = run_worker("pi-jobs", env_overrides=overrides, check=False)

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "model-not-allowed", False), \
        worker.stdout + worker.stderr
    assert not job_file(settings, job_id).exists()  # refused at the gates: no workspace, no container


@pytest.mark.django_db(transaction=True)
def test_under_a_dollar_cap_every_listed_model_must_be_priced(run_worker, tmp_path):
    capped = {"PI_MAX_COST_USD": "1", "PI_DAILY_COST_USD": "5"}
    listed = ("anthropic/claude-sonnet-4-5", "anthropic/house-model")
    refused = enqueue_spec(forge_spec("gh-unpriced", models=listed))
    run_worker("pi-jobs", env_overrides=capped)
    run = Run.objects.get(job_id=refused)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "model-unpriced", False)

    price_file = tmp_path / "prices.json"
    price_file.write_text(json.dumps({"anthropic/house-model": {"input": 1, "output": 2}}))
    priced = enqueue_spec(forge_spec("gh-priced", number=8, models=listed))
    run_worker("pi-jobs", env_overrides={**capped, "PI_MODEL_PRICES": str(price_file)})
    assert Run.objects.get(job_id=priced).outcome == Outcome.COMPLETED


# --- the setting ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, fragment", [
    ("anthropic/claude-sonnet-4-5, anthropic/claude-haiku-4-5", "without spaces"),
    ("claude-sonnet-4-5", "is not provider/model"),
    ("anthropic/claude-sonnet-4-5,Anthropic/Claude-Sonnet-4-5", "twice"),
    (",".join(f"anthropic/model-{n}" for n in range(17)), "1 to 16"),
    ("anthropic/*", "is not provider/model"),
])
def test_a_bad_deployment_list_stops_the_start_naming_the_setting(value, fragment, settings):
    settings.PI_ALLOWED_MODELS = value
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    assert "PI_ALLOWED_MODELS" in str(refused.value) and fragment in str(refused.value)


def test_the_deployments_model_must_be_on_its_list(settings):
    settings.PI_PROVIDER, settings.PI_MODEL = "anthropic", OPUS
    settings.PI_ALLOWED_MODELS = "anthropic/claude-sonnet-4-5"
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    assert "PI_ALLOWED_MODELS does not list the main model anthropic/claude-opus-4-1" in str(refused.value)
    settings.PI_ALLOWED_MODELS = "anthropic/claude-sonnet-4-5,anthropic/claude-opus-4-1"
    call_command("check")
