"""Nothing accepted that can never work: a model no price list knows is refused where it is given (the trigger form,
a triggers file, the API's manual run), saying which models the provider prices; PI_ALLOW_UNKNOWN_MODELS accepts it
with a warning (at save, on the list, on import, by doctor); a run that spent tokens of such a model shows its cost
as unknown (its page, the cost page, the API), never as nothing."""

import html
import json
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.utils import timezone

from apps.access import tokens
from apps.receiver.models import Trigger
from apps.worker import doctor
from apps.worker.models import Run

pytestmark = pytest.mark.django_db

ADD = "/admin/receiver/trigger/add/"
RULE = {"on_type": "label", "enabled": "on", "position": 1, "label_any": "pi", "kind": "github", "flow": "fix-bug",
        "name": "Made up"}


def triggers_file(tmp_path, run: dict):
    path = tmp_path / "triggers.json"
    path.write_text(json.dumps({"triggers": [{"on": {"type": "label", "any": ["pi"]},
                                              "run": {"kind": "github", "flow": "fix-bug", **run}}]}))
    return str(path)


def test_an_unknown_model_is_refused_on_the_form_naming_what_the_provider_prices(admin_client):
    page = html.unescape(admin_client.post(ADD + "?on_type=label", {**RULE, "model": "made-up-model-9000"})
                         .content.decode())
    assert "anthropic has no model “made-up-model-9000” with a known price" in page
    assert "claude-haiku-4-5" in page and "PI_ALLOW_UNKNOWN_MODELS" in page
    assert not Trigger.objects.exists()

    # pi's own names, the ancestor's alias and a pattern pi resolves to a priced model are all known.
    for model in ("claude-sonnet-4-5", "claude-sonnet-4", "sonnet", "claude-opus-4-5:high"):
        saved = admin_client.post(ADD + "?on_type=label", {**RULE, "name": model, "model": model, "position": 2})
        assert saved.status_code == 302, model
    assert Trigger.objects.count() == 4


def test_a_triggers_file_with_an_unknown_model_imports_nothing_and_an_operator_price_makes_it_known(
        tmp_path, settings):
    made_up = triggers_file(tmp_path, {"provider": "acme", "model": "coder-1"})
    with pytest.raises(CommandError, match="acme has no model “coder-1” with a known price"):
        call_command("import_triggers", made_up, stdout=StringIO(), stderr=StringIO())
    assert not Trigger.objects.exists()

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"acme/coder-1": {"input": 1, "output": 2}}))
    settings.PI_MODEL_PRICES = str(prices)
    call_command("import_triggers", made_up, stdout=StringIO(), stderr=(said := StringIO()))
    assert Trigger.objects.get().model == "coder-1" and "warning" not in said.getvalue()


def test_allowed_unknown_models_are_accepted_with_a_warning_everywhere_they_are_seen(admin_client, tmp_path,
                                                                                      settings):
    settings.PI_ALLOW_UNKNOWN_MODELS = True
    call_command("import_triggers", triggers_file(tmp_path, {"model": "made-up-model-9000"}), stdout=StringIO(),
                 stderr=(said := StringIO()))
    assert "run.model: anthropic has no price for “made-up-model-9000”: its runs' cost will be unknown" in \
        said.getvalue()

    saved = html.unescape(admin_client.post(ADD + "?on_type=label", {**RULE, "label_any": "ai", "model": "gpt-made-up"},
                                            follow=True).content.decode())
    assert "anthropic has no price for “gpt-made-up”" in saved
    listed = html.unescape(admin_client.get("/admin/receiver/trigger/").content.decode())
    assert "“made-up-model-9000”" in listed and "“gpt-made-up”" in listed
    found = [f for f in doctor.check_triggers() if f.status == doctor.WARN]
    assert len(found) == 2 and all("cost will be unknown" in f.finding for f in found)

    Trigger.objects.update(model="claude-haiku-4-5")
    assert [f.status for f in doctor.check_triggers()] == [doctor.OK]


def test_a_manual_run_with_an_unknown_model_is_refused_before_anything_is_queued(client, settings, redis_conn):
    settings.GITHUB_TOKEN = "ghp-x"
    user = User.objects.create_superuser("operator", password="x")
    _, token = tokens.issue(user, name="runs", scope="operate")

    def start(model):
        return client.post("/api/v1/runs", data={"forge": "github", "repository": "acme/web", "number": 7,
                                                 "model": model},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")

    refused = start("made-up-model-9000")
    assert refused.status_code == 400
    assert "anthropic has no model “made-up-model-9000”" in refused.json()["fields"]["model"][0]
    assert not redis_conn.keys("rq:job:*")
    assert start("claude-haiku-4-5").status_code == 202


def test_the_deployments_own_unpriced_model_is_a_settings_warning_and_a_doctor_warning(settings):
    settings.PI_MODEL = "made-up-model-9000"
    warned = [message for message in run_checks() if message.id == "worker.W005"]
    assert len(warned) == 1 and "PI_MODEL=made-up-model-9000 has no known price" in warned[0].msg
    settings.PI_MODEL = "claude-sonnet-4-5"
    assert not [message for message in run_checks() if message.id == "worker.W005"]


def test_a_run_of_an_unpriced_model_shows_an_unknown_cost_not_nothing(admin_client, client):
    now = timezone.now()
    unpriced = Run.objects.create(job_id="job-unpriced", attempt=1, kind="github", target="acme/web#1",
                                  started_at=now - timedelta(minutes=2), ended_at=now - timedelta(minutes=1),
                                  outcome="completed", tokens_total=1200, cost=None,
                                  usage={"source": "gateway", "models": [{"provider": "anthropic", "model": "unlisted",
                                                                          "calls": 1, "total": 1200}]})
    refused = Run.objects.create(job_id="job-refused", attempt=1, kind="github", target="acme/web#2",
                                 started_at=now - timedelta(minutes=2), ended_at=now - timedelta(minutes=1),
                                 outcome="refused", reason="model-unpriced", tokens_total=0, cost=None)
    priced = Run.objects.create(job_id="job-priced", attempt=1, kind="github", target="acme/web#3",
                                started_at=now - timedelta(minutes=2), ended_at=now - timedelta(minutes=1),
                                outcome="completed", tokens_total=900, cost=Decimal("0.0252"))

    page = admin_client.get(f"/admin/worker/run/{unpriced.pk}/change/").content.decode()
    assert "unknown (a model without a price)" in page
    assert "unknown" not in admin_client.get(f"/admin/worker/run/{priced.pk}/change/").content.decode()
    refused_page = admin_client.get(f"/admin/worker/run/{refused.pk}/change/").content.decode()
    assert "unknown (a model without a price)" not in refused_page  # refused before a token: nothing spent

    cost_page = html.unescape(admin_client.get("/admin/insight/spend/").content.decode())
    assert "1 at an unknown cost (a model without a price: not counted)" in cost_page

    user = User.objects.get(username="admin")
    _, token = tokens.issue(user, name="read", scope="read")
    listed = client.get("/api/v1/runs?page_size=10", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    by_job = {run["job_id"]: run for run in listed["results"]}
    assert by_job["job-unpriced"]["cost"] is None and by_job["job-unpriced"]["cost_unknown"] is True
    assert by_job["job-refused"]["cost_unknown"] is False and by_job["job-priced"]["cost_unknown"] is False
