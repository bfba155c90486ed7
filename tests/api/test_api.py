"""The REST API (/api/v1/): tokens and their scopes, never beyond their user's permissions; every endpoint's
answer for every kind of caller; the state changes going through the services the admin and the commands use."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.access import tokens
from apps.fleet import pauses
from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run

pytestmark = pytest.mark.django_db

READ_PERMISSIONS = ("worker.view_run", "worker.view_scopedlimit", "worker.view_pausewindow",
                    "worker.view_dispatchsettings", "receiver.view_trigger", "receiver.view_delivery",
                    "fleet.view_fleet")
OPERATE_PERMISSIONS = ("worker.start_run", "fleet.pause_fleet", "fleet.cancel_job", "receiver.change_delivery")
ADMIN_PERMISSIONS = ("receiver.manage_triggers", "worker.manage_limits", "worker.manage_settings",
                     "worker.add_pausewindow", "worker.change_pausewindow", "worker.delete_pausewindow")
LABEL_RULE = {"on": {"type": "label", "any": ["pi"]}, "run": {"kind": "github", "flow": "fix-bug"}}


def user_with(name: str, permissions) -> User:
    user = User.objects.create_user(name, password="x")
    for dotted in permissions:
        app, codename = dotted.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return User.objects.get(pk=user.pk)  # a fresh object: no cached permissions


@pytest.fixture
def operator():
    return user_with("operator", READ_PERMISSIONS + OPERATE_PERMISSIONS + ADMIN_PERMISSIONS)


def bearer(user, scope, **kwargs):
    _, token = tokens.issue(user, name="test", scope=scope, **kwargs)
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def call(client, method, path, headers, body=None):
    sender = getattr(client, method)
    if body is None:
        return sender(path, **headers)
    return sender(path, data=body, content_type="application/json", **headers)


# (method, path, body, the scope it needs)
ENDPOINTS = [
    ("get", "/api/v1/runs", None, "read"),
    ("get", "/api/v1/triggers", None, "read"),
    ("get", "/api/v1/triggers/export", None, "read"),
    ("get", "/api/v1/deliveries", None, "read"),
    ("get", "/api/v1/limits", None, "read"),
    ("get", "/api/v1/pause-windows", None, "read"),
    ("get", "/api/v1/settings", None, "read"),
    ("get", "/api/v1/spend", None, "read"),
    ("get", "/api/v1/reasons", None, "read"),
    ("get", "/api/v1/fleet", None, "read"),
    ("get", "/api/v1/fleet/hosts", None, "read"),
    ("get", "/api/v1/fleet/queues", None, "read"),
    ("get", "/api/v1/jobs/gh-nothing", None, "read"),
    ("post", "/api/v1/jobs/gh-nothing/cancel", {}, "operate"),
    ("post", "/api/v1/fleet/queues/pi-jobs/pause", {"note": "matrix"}, "operate"),
    ("post", "/api/v1/fleet/queues/pi-jobs/resume", {}, "operate"),
    ("post", "/api/v1/runs", {"forge": "github", "repository": "acme/web", "number": 7, "flow": "fix-bug"}, "operate"),
    ("post", "/api/v1/triggers", LABEL_RULE, "admin"),
    ("post", "/api/v1/limits", {"scope": "acme/web", "day": 3}, "admin"),
    ("patch", "/api/v1/settings", {"daily_cap": 9}, "admin"),
    # Objects that do not exist: the scope and permissions are checked first, so the allowed get 404, not 403.
    ("get", "/api/v1/runs/999", None, "read"),
    ("get", "/api/v1/triggers/999", None, "read"),
    ("get", "/api/v1/deliveries/999", None, "read"),
    ("get", "/api/v1/limits/999", None, "read"),
    ("get", "/api/v1/pause-windows/999", None, "read"),
    ("post", "/api/v1/deliveries/999/replay", {}, "operate"),
    ("post", "/api/v1/deliveries/999/discard", {}, "operate"),
    ("post", "/api/v1/fleet/pause-all", {"note": "matrix"}, "operate"),
    ("post", "/api/v1/fleet/hosts/hostA/drain", {"note": "matrix"}, "operate"),
    ("post", "/api/v1/fleet/hosts/hostA/undrain", {}, "operate"),
    ("post", "/api/v1/fleet/resume-all", {}, "operate"),
    ("put", "/api/v1/triggers/999", LABEL_RULE, "admin"),
    ("patch", "/api/v1/triggers/999", {"enabled": False}, "admin"),
    ("delete", "/api/v1/triggers/999", None, "admin"),
    ("post", "/api/v1/triggers/999/enable", {}, "admin"),
    ("post", "/api/v1/triggers/999/disable", {}, "admin"),
    ("post", "/api/v1/triggers/import?dry_run=true", {"triggers": [LABEL_RULE]}, "admin"),
    ("patch", "/api/v1/limits/999", {"day": 4}, "admin"),
    ("delete", "/api/v1/limits/999", None, "admin"),
    ("post", "/api/v1/pause-windows", {"name": "night", "start": "22:00", "end": "06:00"}, "admin"),
    ("delete", "/api/v1/pause-windows/999", None, "admin"),
    ("put", "/api/v1/settings", {"daily_cap": 9}, "admin"),
]
RANK = {"read": 1, "operate": 2, "admin": 3}


@pytest.mark.parametrize("method, path, body, needed", ENDPOINTS, ids=[f"{m} {p}" for m, p, _, _ in ENDPOINTS])
def test_every_endpoint_answers_each_caller_as_its_scope_and_permissions_say(client, operator, method, path, body,
                                                                            needed):
    assert call(client, method, path, {}, body).status_code == 401  # anonymous
    for scope in ("read", "operate", "admin"):
        answer = call(client, method, path, bearer(operator, scope), body)
        if RANK[scope] >= RANK[needed]:
            assert answer.status_code not in (401, 403), (scope, answer.status_code, answer.content)
        else:
            assert answer.status_code == 403 and answer.json()["error"] == "forbidden", (scope, answer.content)
    expired = bearer(operator, "admin")
    tokens_row = operator.api_tokens.order_by("-created_at").first()
    tokens_row.expires_at = timezone.now() - timedelta(seconds=1)
    tokens_row.save()
    assert call(client, method, path, expired, body).status_code == 401
    # A token never exceeds its user: the same admin token without the user's permission for this endpoint.
    bare = user_with(f"bare-{method}-{len(path)}", ())
    assert call(client, method, path, bearer(bare, "admin"), body).status_code == 403


def test_a_revoked_token_is_refused_and_the_token_is_stored_as_a_digest(client, operator):
    row, token = tokens.issue(operator, name="ci", scope="read")
    assert token.startswith("pid_") and token not in row.digest and row.prefix == token[:10]
    assert client.get("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    row.refresh_from_db()
    assert row.last_used_at is not None
    tokens.revoke(type(row).objects.filter(pk=row.pk))
    answer = client.get("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 401 and answer.json()["error"] == "authentication-failed"


def test_validation_errors_name_the_field_and_unknown_fields_are_refused(client, operator):
    headers = bearer(operator, "admin")
    wrong = call(client, "post", "/api/v1/triggers", headers, {"on": {"type": "label", "any": "pi"},
                                                               "run": {"kind": "github", "flow": "Fix Bug"}})
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid"
    assert {"on.any", "run.flow"} <= set(wrong.json()["fields"])
    typo = call(client, "post", "/api/v1/limits", headers, {"scope": "acme/web", "dya": 3})
    assert typo.status_code == 400 and typo.json()["fields"] == {"dya": ["unknown field"]}
    filters = client.get("/api/v1/runs?outcom=failed", **headers)
    assert filters.status_code == 400 and "outcom" in filters.json()["fields"]


def test_triggers_are_the_importers_language_round_trip(client, operator):
    headers = bearer(operator, "admin")
    made = call(client, "post", "/api/v1/triggers", headers, LABEL_RULE)
    assert made.status_code == 201
    document = made.json()
    assert document["on"] == {"type": "label", "any": ["pi"]} and document["run"]["flow"] == "fix-bug"
    assert Trigger.objects.get(pk=document["id"]).label_any == ["pi"]
    disabled = call(client, "post", f"/api/v1/triggers/{document['id']}/disable", headers, {})
    assert disabled.json()["enabled"] is False
    exported = client.get("/api/v1/triggers/export", **headers).json()
    dry = call(client, "post", "/api/v1/triggers/import?dry_run=true", headers, exported)
    assert dry.status_code == 200 and dry.json()["triggers"] == 1 and dry.json()["dry_run"] is True


def test_a_trigger_is_named_through_the_api_as_in_its_file(client, operator):
    headers = bearer(operator, "admin")
    made = call(client, "post", "/api/v1/triggers", headers, {**LABEL_RULE, "name": "Fix labelled bugs"}).json()
    assert made["name"] == "Fix labelled bugs" == Trigger.objects.get(pk=made["id"]).name
    renamed = call(client, "patch", f"/api/v1/triggers/{made['id']}", headers, {"name": "Labelled bugs"}).json()
    assert renamed["name"] == "Labelled bugs" and renamed["on"] == made["on"]
    assert client.get("/api/v1/triggers/export", **headers).json()["triggers"][0]["name"] == "Labelled bugs"
    too_long = call(client, "patch", f"/api/v1/triggers/{made['id']}", headers, {"name": "x" * 101})
    assert too_long.status_code == 400 and Trigger.objects.get(pk=made["id"]).name == "Labelled bugs"


def test_a_manual_forge_run_is_queued_through_the_manual_run_service(client, operator, settings, redis_conn):
    settings.GITHUB_TOKEN = "ghp-x"
    answer = call(client, "post", "/api/v1/runs", bearer(operator, "operate"),
                  {"forge": "github", "repository": "acme/web", "number": 7, "flow": "fix-bug", "task": "Look."})
    assert answer.status_code == 202
    job_id = answer.json()["job_id"]
    assert job_id.startswith("run-") and answer.json()["queue"] == "pi-jobs"
    where = client.get(f"/api/v1/jobs/{job_id}", **bearer(operator, "read")).json()
    assert (where["state"], where["queue"], where["runs"]) == ("queued", "pi-jobs", [])
    refused = call(client, "post", "/api/v1/runs", bearer(operator, "operate"),
                   {"forge": "github", "repository": "acme/web", "number": 7, "flow": "Not A Flow"})
    assert refused.status_code == 400 and "flow" in refused.json()["fields"]


def test_pause_all_through_the_api_is_the_fleets_own_report(client, operator, redis_conn):
    answer = call(client, "post", "/api/v1/fleet/pause-all", bearer(operator, "operate"), {"note": "provider outage"})
    assert answer.status_code == 200 and answer.json()["ok"] is True
    assert "pi-jobs" in answer.json()["changed"]
    flag = pauses.read_flags(redis_conn)["pi-jobs"]
    assert flag.note == "provider outage" and flag.by == "api:operator(" + operator.api_tokens.first().prefix + ")"
    queues = client.get("/api/v1/fleet/queues", **bearer(operator, "read")).json()
    assert queues["state"] == "PAUSED"
    assert call(client, "post", "/api/v1/fleet/resume-all", bearer(operator, "operate"), {}).json()["ok"] is True


def test_the_runs_list_costs_a_fixed_number_of_queries_whatever_its_length(client, operator):
    now = timezone.now()
    headers = bearer(operator, "read")

    def queries_for(count):
        Run.objects.bulk_create(Run(job_id=f"gh-q{count}-{i}", kind="github", started_at=now - timedelta(seconds=i),
                                    ended_at=now, outcome=Outcome.COMPLETED) for i in range(count))
        client.get("/api/v1/runs", **headers)  # the token's last-used write happens once a minute at most
        with CaptureQueriesContext(connection) as captured:
            answer = client.get("/api/v1/runs?page_size=100", **headers)
        assert answer.status_code == 200 and len(answer.json()["results"]) == 100
        return len(captured)

    assert queries_for(150) == queries_for(3000)


def test_the_runs_list_pages_newest_first_with_a_cursor(client, operator):
    now = timezone.now()
    Run.objects.bulk_create(Run(job_id=f"gh-page-{i}", kind="github", started_at=now - timedelta(minutes=i),
                                ended_at=now, outcome=Outcome.FAILED if i % 2 else Outcome.COMPLETED)
                            for i in range(7))
    headers = bearer(operator, "read")
    first = client.get("/api/v1/runs?page_size=3&outcome=completed", **headers).json()
    assert [run["job_id"] for run in first["results"]] == ["gh-page-0", "gh-page-2", "gh-page-4"]
    second = client.get(first["next"], **headers).json()
    assert [run["job_id"] for run in second["results"]] == ["gh-page-6"] and second["next"] is None


def test_the_public_edge_serves_no_api(settings, client):
    import importlib

    from django.urls import clear_url_caches, set_urlconf

    import pidispatch_site.urls as urls

    settings.PI_PUBLIC_EDGE = True
    try:
        importlib.reload(urls)
        clear_url_caches()
        assert client.get("/api/v1/runs").status_code == 404
    finally:
        settings.PI_PUBLIC_EDGE = False
        importlib.reload(urls)
        clear_url_caches()
        set_urlconf(None)


def test_the_schema_and_its_docs_page_are_served_from_here(client, operator):
    client.force_login(User.objects.create_superuser("root", password="x"))
    schema = client.get("/api/v1/schema/?format=json")
    assert schema.status_code == 200 and schema.json()["openapi"].startswith("3.")
    assert "/api/v1/runs" in schema.json()["paths"]
    docs = client.get("/api/v1/docs/").content.decode()
    # Its assets come from here: no script or style from another host (a CDN). (Not a search for "cdn": the page's
    # random CSRF token may spell it.)
    assert "swagger-ui" in docs and not re.findall(r'(?:src|href)=["\'](?:https?:)?//', docs), docs


def test_requests_past_the_rate_get_429_with_retry_after(client, operator, settings):
    from django.core.cache import caches

    settings.PI_API_RATE = "3/min"
    caches["api"].clear()
    headers = bearer(operator, "read")
    answers = [client.get("/api/v1/spend", **headers) for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [200] * 3
    assert answers[3].status_code == 429 and int(answers[3]["Retry-After"]) > 0


def test_a_run_says_what_its_reason_means_from_the_one_table(client, operator):
    from apps.worker import reasons

    run = Run.objects.create(job_id="gh-explained", kind="github", target="acme/web#7", started_at=timezone.now(),
                             ended_at=timezone.now(), outcome=Outcome.FAILED, reason="container-exit-unknown")
    shown = client.get(f"/api/v1/runs/{run.pk}", **bearer(operator, "read")).json()["reason_explained"]
    assert shown == reasons.explain("container-exit-unknown").as_json() and shown["next"]
    table = client.get("/api/v1/reasons", **bearer(operator, "read")).json()
    assert {"token": "container-exit-unknown", **{k: shown[k] for k in ("means", "next")}} in table


def test_a_runs_log_is_read_only_with_its_own_permission(client, operator):
    from apps.worker.models import RunLog

    run = Run.objects.create(job_id="gh-logged", kind="github", target="acme/web#7", started_at=timezone.now(),
                             ended_at=timezone.now(), outcome=Outcome.COMPLETED)
    path = f"/api/v1/runs/{run.pk}/log"
    assert client.get(path, **bearer(operator, "admin")).status_code == 403  # view_run is not enough
    reader = user_with("log-reader", READ_PERMISSIONS + ("worker.view_run_log",))
    missing = client.get(path, **bearer(reader, "read"))
    assert missing.status_code == 404 and "PI_CAPTURE_JOB_LOGS" in missing.json()["detail"]
    RunLog.objects.create(run=run, output="the container said hello", summary="Fixed the footer.",
                          created_at=timezone.now())
    shown = client.get(path, **bearer(reader, "read")).json()
    assert "Fixed the footer." in shown["log"] and "the container said hello" in shown["log"]


def test_spend_shows_every_window_in_force_dollars_included(client, operator, settings, redis_conn):
    from decimal import Decimal

    from apps.worker.gates import budget, runtime_settings
    from tests.jobspecs import forge_spec

    settings.PI_MAX_COST_USD, settings.PI_DAILY_COST_USD = "2", "5"
    hold = budget.reserve_dollars(redis_conn, forge_spec("gh-spend"), None, runtime_settings.current(),
                                  timezone.now())
    budget.settle_dollars(redis_conn, hold, ran=True, cost=Decimal("0.75"))
    budget.reserve_dollars(redis_conn, forge_spec("gh-spend-2"), None, runtime_settings.current(), timezone.now())

    lines = client.get("/api/v1/spend", **bearer(operator, "read")).json()["budget"]
    dollars_today = next(line for line in lines if (line["ledger"], line["window"], line["scope"]) ==
                         ("dollars", "day", ""))
    assert (Decimal(dollars_today["used"]), Decimal(dollars_today["held"]), Decimal(dollars_today["cap"])) == \
        (Decimal("0.75"), Decimal("2"), Decimal("5")) and dollars_today["state"] == "ok"
    assert {(line["ledger"], line["window"]) for line in lines} >= {("jobs", "day"), ("tokens", "day")}


def test_a_scoped_limit_takes_dollar_caps_through_the_api(client, operator, settings):
    settings.PI_MAX_COST_USD = ""
    refused = call(client, "post", "/api/v1/limits", bearer(operator, "admin"),
                   {"scope": "acme/web", "day": 3, "day_usd": "12.50"})
    assert refused.status_code == 400 and "needs a per-run cap" in refused.json()["fields"]["day_usd"][0]

    settings.PI_MAX_COST_USD = "1"
    made = call(client, "post", "/api/v1/limits", bearer(operator, "admin"),
                {"scope": "acme/web", "day": 3, "day_usd": "12.50"})
    assert made.status_code == 201, made.content
    assert made.json()["day_usd"].startswith("12.5")
