"""POST /hooks/github: verification, answers, the inbox, matching and the queue (real Redis)."""

import json

import pytest
from rq import Queue

from apps.receiver.models import Delivery, DeliveryStatus
from tests.conftest import github_payload
from tests.receiver_support import github_signature

pytestmark = pytest.mark.django_db


def queued_job_ids(redis_conn, name="pi-jobs"):
    return Queue(name, connection=redis_conn).get_job_ids()


def test_matching_label_queues_one_job(post_github, label_trigger, redis_conn):
    response = post_github(github_payload(labels=("bug", "pi")), delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")

    assert response.status_code == 202
    assert response.json() == {"status": "queued", "jobs": ["gh-72d3162e-cc78-11e3-81ab-4c9367dc0958"]}
    assert queued_job_ids(redis_conn) == ["gh-72d3162e-cc78-11e3-81ab-4c9367dc0958"]
    job = Queue("pi-jobs", connection=redis_conn).fetch_job("gh-72d3162e-cc78-11e3-81ab-4c9367dc0958")
    spec = job.args[0]
    assert spec["repo"] == "acme/web" and spec["number"] == 7 and spec["flow"] == "fix-bug"
    assert spec["trigger_id"] == label_trigger.pk
    assert spec["context"]["matched"] == {"index": 0, "type": "label", "label": "pi"}
    assert spec["context"]["sender"] == {"id": "4410987"}  # the id only, never the login


def test_inbox_keeps_ids_and_drops_the_payload_once_queued(post_github, label_trigger):
    post_github(github_payload(), delivery="d-inbox")

    delivery = Delivery.objects.get(forge="github", delivery_id="d-inbox")
    assert delivery.status == DeliveryStatus.QUEUED
    assert delivery.job_ids == ["gh-d-inbox"]
    assert delivery.payload is None
    assert delivery.event == "issues"


def test_redelivery_answers_duplicate_and_creates_nothing(post_github, label_trigger, redis_conn):
    body = github_payload()
    first = post_github(body, delivery="same-guid")
    second = post_github(body, delivery="same-guid")

    assert first.status_code == 202 and first.json()["status"] == "queued"
    assert second.status_code == 202
    assert second.json() == {"status": "duplicate", "rule": "delivery-id", "jobs": ["gh-same-guid"]}
    assert queued_job_ids(redis_conn) == ["gh-same-guid"]
    assert Delivery.objects.count() == 1


def test_enqueue_is_unique_on_the_job_id_even_without_the_inbox(label_trigger, redis_conn):
    from apps.worker.jobs import JobSpec, enqueue

    spec = JobSpec(job_id="gh-race", kind="github", repo="acme/web", target_type="issue", number=7, flow="fix")
    assert enqueue(spec, "pi-jobs").status == "created"
    assert enqueue(spec, "pi-jobs").status == "existing"
    assert queued_job_ids(redis_conn) == ["gh-race"]


@pytest.mark.parametrize(
    "signature",
    [
        "sha256=" + "0" * 64,
        github_signature(b"a different body"),
        github_signature(b"{}", secret="wrong-secret"),
        "sha1=0123456789abcdef0123456789abcdef01234567",
        "garbage",
    ],
)
def test_wrong_signature_is_401_and_stores_nothing(post_github, label_trigger, redis_conn, signature):
    response = post_github(github_payload(), signature=signature)

    assert response.status_code == 401
    assert response.json() == {"error": "invalid-signature"}
    assert Delivery.objects.count() == 0
    assert queued_job_ids(redis_conn) == []


def test_missing_signature_is_401_and_stores_nothing(client, label_trigger, redis_conn):
    response = client.post(
        "/hooks/github", data=github_payload(), content_type="application/json",
        HTTP_X_GITHUB_EVENT="issues", HTTP_X_GITHUB_DELIVERY="d-nosig",
    )

    assert response.status_code == 401
    assert response.json() == {"error": "missing-signature"}
    assert Delivery.objects.count() == 0
    assert queued_job_ids(redis_conn) == []


def test_non_matching_label_is_ignored_without_a_job(post_github, label_trigger, redis_conn):
    response = post_github(github_payload(labels=("bug", "documentation")), delivery="d-nomatch")

    assert response.status_code == 200
    assert response.json() == {"status": "ignored", "reason": "no-allowlisted-label"}
    assert queued_job_ids(redis_conn) == []
    delivery = Delivery.objects.get(delivery_id="d-nomatch")
    assert (delivery.status, delivery.reason, delivery.payload) == (DeliveryStatus.IGNORED, "no-allowlisted-label",
                                                                    None)


def test_label_predicates_all_and_none(post_github, redis_conn):
    from apps.receiver.models import Trigger

    Trigger.objects.create(position=0, kind="github", on_type="label", label_all=["pi", "frontend"],
                           label_none=["wontfix"], flow="frontend-fix")
    Trigger.objects.create(position=1, kind="github", on_type="label", label_any=["pi"], flow="triage")

    both = post_github(github_payload(labels=("pi", "frontend")), delivery="d-both").json()
    vetoed = post_github(github_payload(labels=("pi", "frontend", "wontfix")), delivery="d-veto").json()

    queue = Queue("pi-jobs", connection=redis_conn)
    assert queue.fetch_job(both["jobs"][0]).args[0]["flow"] == "frontend-fix"
    # `none` suppressed the first rule, so file order falls through to the second.
    assert queue.fetch_job(vetoed["jobs"][0]).args[0]["flow"] == "triage"


def test_disabled_and_other_forge_triggers_never_match(post_github, redis_conn):
    from apps.receiver.models import Trigger

    Trigger.objects.create(position=0, kind="github", on_type="label", label_any=["pi"], flow="off", enabled=False)
    Trigger.objects.create(position=1, kind="gitlab", on_type="label", label_any=["pi"], flow="elsewhere")

    response = post_github(github_payload(), delivery="d-off")

    assert response.json() == {"status": "ignored", "reason": "no-allowlisted-label"}


def test_own_events_are_ignored_by_the_bot_loop_guard(post_github, label_trigger, redis_conn):
    response = post_github(github_payload(sender_id=424242), delivery="d-self")

    assert response.json() == {"status": "ignored", "reason": "self"}
    assert queued_job_ids(redis_conn) == []


def test_missing_sender_id_fails_closed(post_github, label_trigger, redis_conn):
    payload = json.loads(github_payload())
    payload["sender"] = {"login": "someone"}
    response = post_github(json.dumps(payload).encode(), delivery="d-nosender")

    assert response.json() == {"status": "ignored", "reason": "missing-sender-id"}
    assert queued_job_ids(redis_conn) == []


def test_other_events_are_ignored(post_github, label_trigger):
    response = post_github(json.dumps({"zen": "Keep it simple.", "hook_id": 1, "sender": {"id": 1}}).encode(),
                           event="ping", delivery="d-ping")

    assert response.json() == {"status": "ignored", "reason": "unhandled-event"}


def test_unlabeled_never_fires(post_github, label_trigger, redis_conn):
    response = post_github(github_payload(labels=("pi",), action="unlabeled"), delivery="d-unlabel")

    assert response.json() == {"status": "ignored", "reason": "unhandled-event"}
    assert queued_job_ids(redis_conn) == []


def test_verified_but_malformed_payload_is_400_with_a_reason(post_github, label_trigger):
    payload = json.loads(github_payload())
    del payload["issue"]["number"]
    response = post_github(json.dumps(payload).encode(), delivery="d-malformed")

    assert response.status_code == 400
    assert response.json() == {"error": "missing-issue-number"}
    delivery = Delivery.objects.get(delivery_id="d-malformed")
    assert (delivery.status, delivery.payload) == (DeliveryStatus.REJECTED, None)


@pytest.mark.parametrize("body", [b"not json", b"[1, 2, 3]", b"\xff\xfe", b"null"])
def test_invalid_json_is_400_after_verification(post_github, label_trigger, body):
    response = post_github(body, delivery="d-badjson")

    assert response.status_code == 400
    assert response.json() == {"error": "invalid-json"}
    assert Delivery.objects.count() == 0


def test_missing_event_headers_is_400(client, label_trigger):
    body = github_payload()
    response = client.post("/hooks/github", data=body, content_type="application/json",
                           HTTP_X_HUB_SIGNATURE_256=github_signature(body), HTTP_X_GITHUB_EVENT="issues")

    assert response.status_code == 400
    assert response.json() == {"error": "missing-event-headers"}


def test_not_post_is_405(client):
    response = client.get("/hooks/github")

    assert response.status_code == 405
    assert response.json() == {"error": "method-not-allowed"}


def test_not_json_is_415(client):
    response = client.post("/hooks/github", data="a=1", content_type="application/x-www-form-urlencoded")

    assert response.status_code == 415
    assert response.json() == {"error": "unsupported-media-type"}


def test_oversized_body_is_413_before_verification(post_github, settings, label_trigger):
    settings.PI_WEBHOOK_MAX_BYTES = 1024
    body = json.dumps({"padding": "x" * 2048}).encode()

    response = post_github(body, delivery="d-big")

    assert response.status_code == 413
    assert response.json() == {"error": "payload-too-large"}
    assert Delivery.objects.count() == 0


def test_default_limit_is_two_mebibytes(post_github, label_trigger):
    payload = json.loads(github_payload())
    payload["padding"] = "x" * (2 * 1024 * 1024)
    response = post_github(json.dumps(payload).encode(), delivery="d-2mib")

    assert response.status_code == 413


def test_trailing_slash_is_the_same_endpoint(client, label_trigger):
    body = github_payload()
    response = client.post("/hooks/github/", data=body, content_type="application/json",
                           HTTP_X_GITHUB_EVENT="issues", HTTP_X_GITHUB_DELIVERY="d-slash",
                           HTTP_X_HUB_SIGNATURE_256=github_signature(body))

    assert response.status_code == 202


def test_unconfigured_github_is_404(client, settings):
    settings.GITHUB_WEBHOOK_SECRET = ""
    settings.GITHUB_SELF_ID = ""

    response = client.post("/hooks/github", data=b"{}", content_type="application/json")

    assert response.status_code == 404
    assert response.json() == {"error": "forge-not-configured"}


def test_configured_without_secret_refuses_to_start(settings):
    from apps.receiver.forge_config import ForgeConfigError, forge_config

    settings.GITHUB_WEBHOOK_SECRET = ""
    settings.GITHUB_SELF_ID = "424242"
    with pytest.raises(ForgeConfigError, match="GITHUB_WEBHOOK_SECRET is required"):
        forge_config()


def test_redis_down_keeps_the_delivery_and_answers_accepted(post_github, label_trigger, settings):
    from apps.fleet import connection as fleet_connection

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    fleet_connection._client.cache_clear()
    try:
        response = post_github(github_payload(), delivery="d-redis-down")
    finally:
        fleet_connection._client.cache_clear()

    assert response.status_code == 202
    assert response.json() == {"status": "accepted"}
    delivery = Delivery.objects.get(delivery_id="d-redis-down")
    assert delivery.status == DeliveryStatus.PENDING
    assert delivery.payload is not None  # kept until it can be enqueued


def test_no_issue_text_or_login_reaches_the_log(post_github, label_trigger, caplog):
    body = github_payload(body_text="SECRET-BODY-MARKER please fix")
    with caplog.at_level("DEBUG"):
        post_github(body, delivery="d-pii")

    logged = caplog.text
    assert "gh-d-pii" in logged
    for marker in ("SECRET-BODY-MARKER", "Checkout button overlaps", "maintainer-mia", "octo-reporter"):
        assert marker not in logged


def test_healthz_reports_db_and_redis(client, settings):
    from apps.fleet import connection as fleet_connection

    assert client.get("/healthz").json() == {"db": "ok", "redis": "ok"}

    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    fleet_connection._client.cache_clear()
    try:
        response = client.get("/healthz")
    finally:
        fleet_connection._client.cache_clear()
    assert response.status_code == 503
    assert response.json() == {"db": "ok", "redis": "down"}
