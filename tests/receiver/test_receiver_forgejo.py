"""Forgejo and Gitea routes and gates: Forgejo's own action words and the repository-permission lookup."""

import pytest

from apps.receiver.models import Delivery, DeliveryStatus
from tests.receiver_support import dumps, forgejo_headers, job_spec, load, post, queued, rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def send(client, forges):
    def send(event, payload, delivery, flavour="forgejo"):
        body = dumps(payload)
        return post(client, "forgejo", body, forgejo_headers(body, event, delivery, flavour=flavour))

    return send


@pytest.fixture
def writer(forges):
    forges.forgejo_permission("acme/web", "maintainer-mia", "write")
    return forges


def test_label_updated_fires_over_the_whole_label_set(send, writer, redis_conn):
    rule(position=0, kind="forgejo", on_type="label", label_all=["bug", "pi"], flow="fix-bug")

    response = send("issues", load("forgejo/issues_label_updated.json"), "fj-guid-1")

    assert response.json() == {"status": "queued", "jobs": ["fj-fj-guid-1"]}
    spec = job_spec(redis_conn, "fj-fj-guid-1")
    assert (spec["repo"], spec["number"], spec["target_type"]) == ("acme/web", 3, "issue")
    assert spec["context"]["action"] == "label_updated"  # Forgejo's own word is kept
    assert writer.paths() == ["/api/v1/repos/acme/web/collaborators/maintainer-mia/permission"]
    assert writer.requests[0]["headers"]["authorization"] == "token forgejo-test-token"


def test_gitea_deliveries_are_served_on_the_same_path(send, writer, redis_conn):
    rule(position=0, kind="forgejo", on_type="label", label_any=["pi"], flow="fix-bug")
    response = send("issues", load("forgejo/issues_label_updated.json"), "gitea-guid", flavour="gitea")
    assert response.json()["status"] == "queued"


def test_readers_are_refused(send, forges):
    rule(position=0, kind="forgejo", on_type="label", label_any=["pi"], flow="fix-bug")
    forges.forgejo_permission("acme/web", "maintainer-mia", "read")
    assert send("issues", load("forgejo/issues_label_updated.json"), "g").json()["reason"] == "author-not-allowed"


def test_permission_lookup_403_keeps_the_delivery_pending(send, forges):
    rule(position=0, kind="forgejo", on_type="label", label_any=["pi"], flow="fix-bug")
    forges.routes["/api/v1/repos/acme/web/collaborators/maintainer-mia/permission"] = (403, {"message": "token"})

    assert send("issues", load("forgejo/issues_label_updated.json"), "g403").json() == {"status": "accepted"}
    assert Delivery.objects.get(delivery_id="g403").reason == "permission-lookup-failed"


def test_pull_request_rules_match_forgejo_words(send, writer, redis_conn):
    rule(position=0, kind="forgejo", on_type="pull_request", actions=["label_updated"], label_any=["pi-review"],
         flow="review")
    rule(position=1, kind="forgejo", on_type="pull_request", actions=["synchronized"], flow="rebase")

    labelled = send("pull_request", load("forgejo/pull_request_label_updated.json"), "pr-1").json()
    pushed_payload = load("forgejo/pull_request_label_updated.json")
    pushed_payload["action"] = "synchronized"
    pushed = send("pull_request", pushed_payload, "pr-2").json()

    first = job_spec(redis_conn, labelled["jobs"][0])
    assert first["context"]["matched"] == {"index": 0, "type": "pull_request", "action": "label_updated"}
    assert first["head"] == {"ref": "sticky-bar", "sha": "8e2b0f4c1d6a7e3f2a1b0c9d8e7f6a5b4c3d2e1f",
                             "repo": {"full_name": "acme/web"}}
    assert job_spec(redis_conn, pushed["jobs"][0])["flow"] == "rebase"


@pytest.mark.parametrize("action", ["label_cleared", "edited", "assigned", "milestoned", "reviewed",
                                    "review_requested"])
def test_recognised_but_ignored_actions(send, writer, action):
    rule(position=0, kind="forgejo", on_type="label", label_any=["pi"], flow="fix-bug")
    payload = load("forgejo/issues_label_updated.json")
    payload["action"] = action
    assert send("issues", payload, f"a-{action}").json() == {"status": "ignored", "reason": "action-not-actionable"}


def test_unknown_events_and_words_are_unhandled(send, writer):
    payload = load("forgejo/issues_label_updated.json")
    payload["action"] = "transferred"
    assert send("issues", payload, "u1").json()["reason"] == "unhandled-event"
    assert send("push", {"ref": "refs/heads/main", "sender": {"id": 2101}}, "u2").json()["reason"] == "unhandled-event"


def test_merged_pull_request_fires_the_close_rule(send, writer, redis_conn):
    rule(position=0, kind="forgejo", on_type="pull_request", actions=["closed"], flow="release-notes")
    payload = load("forgejo/pull_request_label_updated.json")
    payload["action"] = "closed"
    payload["pull_request"].update(merged=True, state="closed")

    spec = job_spec(redis_conn, send("pull_request", payload, "merged").json()["jobs"][0])

    assert spec["context"]["matched"] == {"index": 0, "type": "pull_request", "action": "closed"}


def test_comment_on_a_pull_request(send, writer, redis_conn):
    rule(position=0, kind="forgejo", on_type="comment", phrase="@pi", flow="review")
    payload = {
        "action": "created", "is_pull": True,
        "issue": {"id": 9, "number": 4, "title": "Sticky checkout bar", "body": "...", "labels": []},
        "comment": {"id": 55, "body": "@pi have a look", "user": {"id": 2101, "login": "maintainer-mia"}},
        "repository": {"id": 77, "full_name": "acme/web"},
        "sender": {"id": 2101, "login": "maintainer-mia", "username": "maintainer-mia"},
    }

    spec = job_spec(redis_conn, send("issue_comment", payload, "cm").json()["jobs"][0])

    assert (spec["target_type"], spec["number"], spec["comment"]) == ("pull_request", 4, "@pi have a look")
    payload["action"] = "edited"
    assert send("issue_comment", payload, "cm2").json()["reason"] == "action-not-actionable"


def test_a_pending_lookup_becomes_a_job_on_replay(send, forges, redis_conn):
    from apps.receiver import intake

    rule(position=0, kind="forgejo", on_type="label", label_any=["pi"], flow="fix-bug")
    forges.routes["/api/v1/repos/acme/web/collaborators/maintainer-mia/permission"] = (503, {})
    send("issues", load("forgejo/issues_label_updated.json"), "later")
    delivery = Delivery.objects.get(delivery_id="later")
    assert delivery.status == DeliveryStatus.PENDING

    forges.forgejo_permission("acme/web", "maintainer-mia", "admin")
    answer = intake.replay(delivery)

    assert answer.body == {"status": "queued", "jobs": ["fj-later"]}
    delivery.refresh_from_db()
    assert (delivery.status, delivery.payload, delivery.attempts) == (DeliveryStatus.QUEUED, None, 2)
    assert queued(redis_conn) == ["fj-later"]
