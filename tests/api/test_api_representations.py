"""The API's representations: every serializer names its fields (a new column is never public by default), brief
lists, filters that take several values and time ranges and refuse what they do not know, money as a decimal
string of six places at most, triggers written through their serializer, pause-all's note, and the committed
OpenAPI schema that shows every API change in review."""

import ast
import difflib
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from apps.access import tokens
from apps.fleet import pauses
from apps.receiver.models import Delivery, DeliveryStatus, Trigger
from apps.worker.models import Outcome, Run, ScopedLimit

pytestmark = pytest.mark.django_db

ROOT = Path(django_settings.BASE_DIR)
SOURCE_FOLDERS = ("apps", "pidispatch_site", "bench", "devtools")
COMMITTED_SCHEMA = ROOT / "docs" / "openapi.yaml"
REGENERATE = ".venv/bin/python manage.py spectacular --file docs/openapi.yaml --validate --fail-on-warn"
LABEL_RULE = {"on": {"type": "label", "any": ["pi"]}, "run": {"kind": "github", "flow": "fix-bug"}}


@pytest.fixture
def headers(settings, redis_conn):
    settings.PI_API_RATE = "100000/min"
    root = User.objects.create_superuser("representations", password="x")
    _, token = tokens.issue(root, name="representations", scope="admin")
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def run(job_id: str, *, minutes_ago: int = 0, **fields) -> Run:
    started = timezone.now() - timedelta(minutes=minutes_ago)
    return Run.objects.create(**{"job_id": job_id, "kind": "github", "target": "acme/web#7", "started_at": started,
                                 "ended_at": started + timedelta(seconds=30), "outcome": Outcome.COMPLETED, **fields})


def job_ids(answer) -> list[str]:
    assert answer.status_code == 200, answer.content
    return [item["job_id"] for item in answer.json()["results"]]


# --- named fields ---------------------------------------------------------------------------------------------

def serializer_metas_that_do_not_name_their_fields(source: str) -> list[str]:
    """`ClassName: what it does` for each serializer class whose Meta says `fields = "__all__"` or `exclude`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ClassDef)
                and any(ast.unparse(base).endswith("Serializer") for base in node.bases)):
            continue
        for meta in (item for item in node.body if isinstance(item, ast.ClassDef) and item.name == "Meta"):
            for statement in meta.body:
                targets = [t.id for t in getattr(statement, "targets", []) if isinstance(t, ast.Name)]
                value = getattr(statement, "value", None)
                if "exclude" in targets:
                    found.append(f"{node.name}: exclude")
                if "fields" in targets and isinstance(value, ast.Constant) and value.value == "__all__":
                    found.append(f'{node.name}: fields = "__all__"')
    return found


def test_the_check_for_unnamed_fields_finds_them():
    offending = 'class A(serializers.ModelSerializer):\n    class Meta:\n        fields = "__all__"\n' \
                'class B(NamedFieldsModelSerializer):\n    class Meta:\n        exclude = ["payload"]\n' \
                'class C(forms.ModelForm):\n    class Meta:\n        fields = "__all__"\n'
    assert serializer_metas_that_do_not_name_their_fields(offending) == ['A: fields = "__all__"', "B: exclude"]


def test_no_serializer_in_the_project_uses_all_fields_or_exclude():
    offenders, serializers_seen = [], 0
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            source = path.read_text()
            serializers_seen += source.count("Serializer):")
            offenders += [f"{path.relative_to(ROOT)}: {what}"
                          for what in serializer_metas_that_do_not_name_their_fields(source)]
    assert serializers_seen > 5  # the walk did reach the API's modules
    assert offenders == [], "name every field (a new column must not become public by default): " + \
        "; ".join(offenders)


def test_a_run_shows_exactly_its_named_fields(client, headers):
    from apps.worker.api import RunSerializer

    shown = client.get(f"/api/v1/runs/{run('gh-named').pk}", **headers).json()
    assert list(shown) == RunSerializer.Meta.fields


# --- brief mode -----------------------------------------------------------------------------------------------

def test_brief_lists_carry_the_small_representation_and_full_ones_the_ledger(client, headers):
    run("gh-brief", outcome=Outcome.FAILED, reason="container-exit-unknown", cost=Decimal("0.0252"),
        usage={"source": "gateway", "models": [{"provider": "anthropic", "model": "claude", "calls": 2,
                                                 "cost": "0.025200"}]})
    brief = client.get("/api/v1/runs?brief=true", **headers).json()["results"]
    assert brief == [{"id": brief[0]["id"], "job_id": "gh-brief", "attempt": 1, "outcome": "failed",
                      "reason": "container-exit-unknown", "target": "acme/web#7", "ended_at": brief[0]["ended_at"]}]
    full = client.get("/api/v1/runs?brief=false", **headers).json()["results"][0]
    assert full["usage"]["models"][0]["cost"] == "0.0252" and full["cost"] == "0.0252"
    Delivery.objects.create(forge="github", delivery_id="d-brief", event="issues", status=DeliveryStatus.QUEUED,
                            job_ids=["gh-brief"], payload=b'{"issue": {"title": "secret title"}}')
    delivery = client.get("/api/v1/deliveries?brief=true", **headers).json()["results"][0]
    assert set(delivery) == {"id", "forge", "delivery_id", "status", "reason", "job_ids", "received_at"}
    assert "secret title" not in client.get("/api/v1/deliveries", **headers).content.decode()


@pytest.mark.parametrize("value", ["yes", "1", "TRUE", ""])
def test_brief_takes_true_or_false_only(client, headers, value):
    answer = client.get("/api/v1/runs", {"brief": value}, **headers)
    assert answer.status_code == 400 and "brief" in answer.json()["fields"]


def test_the_small_tables_answer_brief_and_refuse_a_parameter_they_do_not_take(client, headers):
    limit = ScopedLimit.objects.create(scope="acme/web", day=3, note="busy repository")
    assert client.get("/api/v1/limits?brief=true", **headers).json() == \
        [{"id": limit.pk, "scope": "acme/web", "note": "busy repository"}]
    assert client.get("/api/v1/limits", **headers).json()[0]["day"] == 3
    refused = client.get("/api/v1/pause-windows?scope=acme/web", **headers)
    assert refused.status_code == 400 and "scope" in refused.json()["fields"]


# --- filters --------------------------------------------------------------------------------------------------

def test_a_filter_given_several_times_matches_any_of_its_values(client, headers):
    run("gh-ok"), run("gh-failed", outcome=Outcome.FAILED), run("gh-policy", outcome=Outcome.POLICY)
    assert sorted(job_ids(client.get("/api/v1/runs?outcome=failed&outcome=policy", **headers))) == \
        ["gh-failed", "gh-policy"]
    assert sorted(job_ids(client.get("/api/v1/runs?job_id=gh-ok&job_id=gh-policy", **headers))) == \
        ["gh-ok", "gh-policy"]
    wrong = client.get("/api/v1/runs?outcome=failed&outcome=broken", **headers)
    assert wrong.status_code == 400 and "outcome" in wrong.json()["fields"]


def test_time_ranges_narrow_the_runs_and_the_inbox(client, headers):
    run("gh-old", minutes_ago=120), run("gh-mid", minutes_ago=60), run("gh-new", minutes_ago=5)
    now = timezone.now()
    since = (now - timedelta(minutes=90)).isoformat()
    before = (now - timedelta(minutes=30)).isoformat()
    assert job_ids(client.get("/api/v1/runs", {"started_at__gte": since, "started_at__lt": before}, **headers)) \
        == ["gh-mid"]
    assert job_ids(client.get("/api/v1/runs", {"ended_at__lte": before}, **headers)) == ["gh-mid", "gh-old"]
    assert job_ids(client.get("/api/v1/runs", {"since": since}, **headers)) == ["gh-new", "gh-mid"]
    Delivery.objects.create(forge="github", delivery_id="d-range", status=DeliveryStatus.QUEUED)
    inbox = client.get("/api/v1/deliveries", {"received_at__gte": since, "status": ["queued", "ignored"]},
                       **headers).json()["results"]
    assert [item["delivery_id"] for item in inbox] == ["d-range"]
    assert client.get("/api/v1/deliveries", {"received_at__lt": since}, **headers).json()["results"] == []


@pytest.mark.parametrize("query, field", [
    ("started_at__gte=yesterday", "started_at__gte"),
    ("started_at__gte=2026-12-01T00:00:00", "started_at__gte"),  # no zone: which day would it be?
    ("since=2026-12-01T00:00:00Z&since=2026-12-02T00:00:00Z", "since"),
    ("started_at__between=2026-12-01T00:00:00Z", "started_at__between"),
    ("outcom=failed", "outcom"),
])
def test_a_filter_that_is_not_understood_is_refused_with_its_name(client, headers, query, field):
    answer = client.get(f"/api/v1/runs?{query}", **headers)
    assert answer.status_code == 400 and field in answer.json()["fields"], answer.content


def test_the_inbox_refuses_an_unknown_filter_and_an_unknown_status(client, headers):
    assert "sender" in client.get("/api/v1/deliveries?sender=alice", **headers).json()["fields"]
    assert "status" in client.get("/api/v1/deliveries?status=lost", **headers).json()["fields"]


# --- money ----------------------------------------------------------------------------------------------------

def test_money_is_a_decimal_string_of_six_places_at_most_everywhere(client, headers, settings):
    settings.PI_MAX_COST_USD = "1"  # a scoped limit's dollar window needs a per-run cap
    run("gh-cost-1", cost=Decimal("0.0126"), dollars_reserved=Decimal("2"), dollars_charged=Decimal("0.0126"))
    run("gh-cost-2", cost=Decimal("0.0126"))
    shown = client.get("/api/v1/runs?job_id=gh-cost-1", **headers).json()["results"][0]
    assert (shown["cost"], shown["dollars_reserved"], shown["dollars_charged"]) == ("0.0126", "2", "0.0126")
    assert client.get("/api/v1/spend", **headers).json()["cost_today"] == "0.0252"  # a sum, not "0.0252000000000000"
    made = client.post("/api/v1/limits", {"scope": "acme/web", "day_usd": "12.50"}, content_type="application/json",
                       **headers)
    assert made.status_code == 201 and made.json()["day_usd"] == "12.5"
    assert ScopedLimit.objects.get(scope="acme/web").day_usd == Decimal("12.5")
    settings_row = client.patch("/api/v1/settings", {"max_cost_usd": "2.50", "daily_cost_usd": "5.000100"},
                                content_type="application/json", **headers)
    assert settings_row.status_code == 200, settings_row.content
    assert (settings_row.json()["max_cost_usd"], settings_row.json()["daily_cost_usd"]) == ("2.5", "5.0001")
    too_fine = client.post("/api/v1/limits", {"scope": "acme/api", "day_usd": "0.0000001"},
                           content_type="application/json", **headers)
    assert too_fine.status_code == 400 and "day_usd" in too_fine.json()["fields"]
    assert not ScopedLimit.objects.filter(scope="acme/api").exists()


def test_money_text_rounds_to_six_places_and_drops_trailing_zeros():
    from pidispatch_site.api_base import money_text

    assert [money_text(value) for value in (Decimal("0.0252000000000000"), Decimal("1E+1"), 0, Decimal("-0.0000001"),
                                            Decimal("0.0000005"), "3", None)] == \
        ["0.0252", "10", "0", "0", "0.000001", "3", None]


# --- triggers -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, field", [
    ({**LABEL_RULE, "position": "3"}, "position"),
    ({**LABEL_RULE, "position": -1}, "position"),
    ({**LABEL_RULE, "position": True}, "position"),
    ({**LABEL_RULE, "enabled": "yes"}, "enabled"),
    ({**LABEL_RULE, "enabled": 1}, "enabled"),
    ({**LABEL_RULE, "note": 7}, "note"),
    ({**LABEL_RULE, "note": "n" * 201}, "note"),
    ({**LABEL_RULE, "colour": "red"}, "colour"),
    ({"on": "label", "run": LABEL_RULE["run"]}, "on"),
    ({"run": LABEL_RULE["run"]}, "on"),
])
def test_a_trigger_write_is_checked_by_its_serializer_and_changes_nothing_when_refused(client, headers, body, field):
    answer = client.post("/api/v1/triggers", body, content_type="application/json", **headers)
    assert answer.status_code == 400 and field in answer.json()["fields"], answer.content
    assert not Trigger.objects.exists()


def test_a_trigger_patch_keeps_the_half_it_does_not_give(client, headers):
    made = client.post("/api/v1/triggers", {**LABEL_RULE, "note": "first"}, content_type="application/json",
                       **headers).json()
    patched = client.patch(f"/api/v1/triggers/{made['id']}", {"run": {"kind": "github", "flow": "write-docs"},
                                                              "enabled": False},
                           content_type="application/json", **headers)
    assert patched.status_code == 200, patched.content
    assert (patched.json()["on"], patched.json()["run"]["flow"], patched.json()["enabled"], patched.json()["note"]) \
        == (LABEL_RULE["on"], "write-docs", False, "first")
    replaced = client.put(f"/api/v1/triggers/{made['id']}", {"on": {"type": "label", "any": ["bot"]}},
                          content_type="application/json", **headers)
    assert replaced.status_code == 400 and "run" in replaced.json()["fields"]
    assert Trigger.objects.get(pk=made["id"]).label_any == ["pi"]


# --- pause-all --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [{}, {"note": ""}, {"note": "   "}, {"until": None}])
def test_pause_all_needs_a_note_as_the_panel_does_and_changes_nothing_without(client, headers, redis_conn, body):
    answer = client.post("/api/v1/fleet/pause-all", body, content_type="application/json", **headers)
    assert answer.status_code == 400 and "note" in answer.json()["fields"], answer.content
    assert pauses.read_flags(redis_conn) == {}


def test_pause_all_passes_its_note_through_and_one_queue_still_pauses_without(client, headers, redis_conn):
    answer = client.post("/api/v1/fleet/pause-all", {"note": "provider outage"}, content_type="application/json",
                         **headers)
    assert answer.status_code == 200 and pauses.read_flags(redis_conn)["pi-jobs"].note == "provider outage"
    client.post("/api/v1/fleet/resume-all", {}, content_type="application/json", **headers)
    one = client.post("/api/v1/fleet/queues/pi-jobs/pause", {}, content_type="application/json", **headers)
    assert one.status_code == 200 and "pi-jobs" in pauses.read_flags(redis_conn)


# --- the committed schema ---------------------------------------------------------------------------------------

def test_the_committed_openapi_schema_is_the_apis_own(tmp_path):
    generated = tmp_path / "openapi.yaml"
    call_command("spectacular", file=str(generated), validate=True, fail_on_warn=True)
    committed, fresh = COMMITTED_SCHEMA.read_text(), generated.read_text()
    diff = "".join(list(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                             "docs/openapi.yaml", "generated"))[:60])
    assert committed == fresh, f"the API changed and docs/openapi.yaml did not: run `{REGENERATE}` and commit " \
        f"it, so the change shows in review\n{diff}"
