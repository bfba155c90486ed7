"""GitHub routes and gates: labels, comments, pull requests, reviews, closes (with the closer lookup)."""

import copy
import json

import pytest

from apps.receiver.models import Delivery, DeliveryStatus
from tests.receiver_support import dumps, github_headers, job_spec, load, post, queued, rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def writers(forges):
    """The payloads' commenter, pull request author and reviewer may write to acme/web."""
    for login in ("maintainer-mia", "reviewer-rita"):
        forges.github_permission("acme/web", login, "write")
    return forges


@pytest.fixture
def send(client, forges):
    def send(event, payload, delivery):
        body = dumps(payload)
        return post(client, "github", body, github_headers(body, event, delivery))

    return send


def comment(body="@pi please take this one", association="MEMBER", on_pull_request=False):
    payload = load("github/issue_comment_created.json")
    payload["comment"]["body"] = body
    payload["comment"]["author_association"] = association
    if on_pull_request:
        payload["issue"]["pull_request"] = {"url": "https://api.github.com/repos/acme/web/pulls/7"}
    return payload


def pull_request(action="opened", association="MEMBER", labels=("pi-review",)):
    payload = load("github/pull_request_opened.json")
    payload["action"] = action
    payload["pull_request"]["author_association"] = association
    payload["pull_request"]["labels"] = [{"id": i, "name": name} for i, name in enumerate(labels)]
    return payload


def review(state="changes_requested", association="COLLABORATOR", body="Please cover tablets too.", action="submitted"):
    payload = load("github/pull_request_review_submitted.json")
    payload["action"] = action
    payload["review"].update(state=state, author_association=association, body=body)
    return payload


def issue_closed(number=7, sender_id=6600123, login="closer-carl"):
    payload = load("github/issues_labeled.json")
    payload["action"] = "closed"
    payload["issue"]["number"] = number
    payload["issue"]["state"] = "closed"
    payload["sender"].update(id=sender_id, login=login)
    return payload


# --- labels on issues ------------------------------------------------------------------------------------------

def issue(action="labeled", labels=("pi",), sender_id=4410987, login="maintainer-mia"):
    payload = load("github/issues_labeled.json")
    payload["action"] = action
    payload["issue"]["labels"] = [{"id": i, "name": name} for i, name in enumerate(labels)]
    payload["sender"].update(id=sender_id, login=login)
    return payload


def test_applying_the_label_is_the_approval(send, forges, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")

    response = send("issues", issue("labeled", login="anyone"), "d-lab")

    assert response.json() == {"status": "queued", "jobs": ["gh-d-lab"]}
    assert forges.requests == []  # labelling already needs triage or write access: no lookup


@pytest.mark.parametrize("action", ["opened", "reopened"])
def test_opening_an_issue_that_carries_the_label_needs_write_access(send, forges, redis_conn, action):
    """An author can open an issue from a template that carries the label, or reopen their own labelled
    issue, as often as they like: that is no approval, so the opener's permission is asked as a closer's."""
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    forges.github_permission("acme/web", "author-alex", "read")
    forges.github_permission("acme/web", "maintainer-mia", "maintain")

    refused = send("issues", issue(action, sender_id=5500321, login="author-alex"), f"d-{action}-reader")
    allowed = send("issues", issue(action), f"d-{action}-writer")

    assert refused.json() == {"status": "ignored", "reason": "author-not-allowed"}
    assert allowed.json() == {"status": "queued", "jobs": [f"gh-d-{action}-writer"]}
    assert queued(redis_conn) == [f"gh-d-{action}-writer"]
    assert forges.paths() == ["/repos/acme/web/collaborators/author-alex/permission",
                              "/repos/acme/web/collaborators/maintainer-mia/permission"]
    assert "author-alex" not in json.dumps(job_spec(redis_conn, f"gh-d-{action}-writer"))


def test_opening_an_issue_without_the_label_costs_no_lookup(send, forges):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")

    response = send("issues", issue("opened", labels=("bug",)), "d-nolabel")

    assert response.json() == {"status": "ignored", "reason": "no-allowlisted-label"}
    assert forges.requests == []


def test_opener_lookup_that_cannot_be_answered_keeps_the_delivery_pending(send, forges, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    forges.routes["/repos/acme/web/collaborators/maintainer-mia/permission"] = (502, {"message": "bad gateway"})

    response = send("issues", issue("reopened"), "d-reopen-pend")

    assert response.json() == {"status": "accepted"}
    delivery = Delivery.objects.get(delivery_id="d-reopen-pend")
    assert (delivery.status, delivery.reason) == (DeliveryStatus.PENDING, "permission-lookup-failed")
    assert queued(redis_conn) == []


# --- labels on pull requests -----------------------------------------------------------------------------------

def test_pull_request_label_fires_without_an_author_check(send, redis_conn):
    rule(position=0, kind="github", on_type="pull_request", actions=["labeled"], label_any=["pi-review"], flow="review")

    response = send("pull_request", pull_request("labeled", association="NONE"), "d-prl")

    assert response.json() == {"status": "queued", "jobs": ["gh-d-prl"]}
    spec = job_spec(redis_conn, "gh-d-prl")
    assert (spec["target_type"], spec["number"], spec["flow"]) == ("pull_request", 12, "review")
    assert spec["context"]["matched"] == {"index": 0, "type": "pull_request", "action": "labeled"}
    assert spec["head"] == {"ref": "fix/checkout-footer", "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e",
                            "repo": "acme/web"}
    assert spec["base"] == {"ref": "main"}


def test_pull_request_label_outside_the_predicate_does_not_fire(send):
    rule(position=0, kind="github", on_type="pull_request", actions=["labeled"], label_any=["pi-review"], flow="review")

    response = send("pull_request", pull_request("labeled", labels=("docs",)), "d-prl2")

    assert response.json() == {"status": "ignored", "reason": "no-matching-pr-trigger"}


# --- automatic pull request actions ------------------------------------------------------------------------------

@pytest.mark.parametrize("action", ["opened", "synchronize", "reopened"])
@pytest.mark.parametrize("permission", ["admin", "maintain", "write"])
def test_automatic_pr_actions_of_authors_who_may_write_fire(send, forges, redis_conn, action, permission):
    rule(position=0, kind="github", on_type="pull_request", actions=["opened", "synchronize", "reopened"],
         flow="review")
    forges.github_permission("acme/web", "maintainer-mia", permission)

    response = send("pull_request", pull_request(action), f"d-{action}-{permission}")

    assert response.status_code == 202
    assert job_spec(redis_conn, f"gh-d-{action}-{permission}")["context"]["matched"]["action"] == action


@pytest.mark.parametrize("association", ["NONE", "CONTRIBUTOR", "FIRST_TIME_CONTRIBUTOR", "FIRST_TIMER", ""])
def test_fork_pull_requests_by_outsiders_are_refused(send, redis_conn, association):
    rule(position=0, kind="github", on_type="pull_request", actions=["opened"], flow="review")

    response = send("pull_request", pull_request("opened", association), "d-fork")

    assert response.json() == {"status": "ignored", "reason": "pr-author-not-allowed"}
    assert queued(redis_conn) == []


def test_predicate_narrows_automatic_actions(send):
    rule(position=0, kind="github", on_type="pull_request", actions=["opened"], label_none=["wip"], flow="review")

    response = send("pull_request", pull_request("opened", labels=("wip",)), "d-wip")

    assert response.json() == {"status": "ignored", "reason": "no-matching-pr-trigger"}


def test_unlisted_pull_request_actions_are_unhandled(send):
    rule(position=0, kind="github", on_type="pull_request", actions=["opened"], flow="review")
    for action in ("edited", "unlabeled", "ready_for_review", "assigned"):
        response = send("pull_request", pull_request(action), f"d-{action}")
        assert response.json() == {"status": "ignored", "reason": "unhandled-event"}, action


# --- comments ----------------------------------------------------------------------------------------------

def test_comment_with_the_phrase_runs_the_default_flow(send, writers, redis_conn):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")

    response = send("issue_comment", comment("@pi please take this one"), "d-c1")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert (spec["flow"], spec["target_type"], spec["number"]) == ("triage", "issue", 7)
    assert spec["comment"] == "@pi please take this one"
    assert spec["context"]["matched"] == {"index": 0, "type": "comment", "phrase": "@pi"}
    assert spec["context"]["comment"] == {"body": "@pi please take this one", "author_association": "MEMBER"}


def test_comment_picks_another_known_flow(send, writers, redis_conn):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    rule(position=1, kind="gitlab", on_type="label", label_any=["pi"], flow="frontend-fix")

    chosen = send("issue_comment", comment("thanks! @pi frontend-fix when you can"), "d-c2").json()
    unknown = send("issue_comment", comment("@pi dance"), "d-c3").json()

    assert job_spec(redis_conn, chosen["jobs"][0])["flow"] == "frontend-fix"  # known flows span every forge
    assert job_spec(redis_conn, unknown["jobs"][0])["flow"] == "triage"


def test_comment_command_ignores_trailing_words(send, writers, redis_conn):
    rule(position=0, kind="github", on_type="comment", phrase="/pi", command="summarise")

    response = send("issue_comment", comment("/pi triage now"), "d-cmd")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert (spec["command"], spec["flow"]) == ("summarise", "")


@pytest.mark.parametrize("association", ["NONE", "CONTRIBUTOR", "FIRST_TIME_CONTRIBUTOR", "MANNEQUIN"])
def test_comment_by_an_outsider_is_refused(send, redis_conn, association):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")

    response = send("issue_comment", comment(association=association), "d-out")

    assert response.json() == {"status": "ignored", "reason": "author-not-allowed"}


def test_comment_without_the_phrase(send):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    assert send("issue_comment", comment("just a note"), "d-np").json()["reason"] == "no-trigger-phrase"


def test_comment_on_a_pull_request_targets_the_pull_request(send, writers, redis_conn):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")

    response = send("issue_comment", comment(on_pull_request=True), "d-cpr")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert (spec["target_type"], spec["number"], spec["head"]) == ("pull_request", 7, {})


def test_edited_comments_never_fire(send):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    payload = comment()
    payload["action"] = "edited"
    assert send("issue_comment", payload, "d-ed").json()["reason"] == "unhandled-event"


# --- reviews --------------------------------------------------------------------------------------------------

def test_review_is_gated_on_the_reviewer_not_the_author(send, writers, redis_conn):
    rule(position=0, kind="github", on_type="pull_request", actions=["review_submitted"], flow="address-review")

    response = send("pull_request_review", review(association="COLLABORATOR"), "d-rv")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert spec["context"]["matched"] == {"index": 0, "type": "pull_request", "action": "review_submitted"}
    assert spec["context"]["review"] == {"id": 2418833901, "state": "changes_requested",
                                         "body": "Please cover tablets too.", "author_association": "COLLABORATOR"}
    assert spec["comment"] == "Please cover tablets too."


def test_review_by_an_outsider_is_refused(send):
    rule(position=0, kind="github", on_type="pull_request", actions=["review_submitted"], flow="address-review")
    response = send("pull_request_review", review(association="NONE"), "d-rv2")
    assert response.json() == {"status": "ignored", "reason": "review-author-not-allowed"}


def test_review_states(send, writers, redis_conn):
    rule(position=0, kind="github", on_type="pull_request", actions=["review_submitted"],
         review_states=["changes_requested"], flow="address-review")

    assert (send("pull_request_review", review("APPROVED", body=""), "d-s1").json()["reason"]
            == "review-state-not-matched")
    assert send("pull_request_review", review("commented", body="  "), "d-s2").json()["reason"] == "no-review-body"
    assert send("pull_request_review", review("CHANGES_REQUESTED", body=""), "d-s3").status_code == 202


@pytest.mark.parametrize("state", ["approved", "changes_requested", "commented"])
def test_every_review_verdict_fires_without_a_state_filter(send, writers, state):
    rule(position=0, kind="github", on_type="pull_request", actions=["review_submitted"], flow="address-review")
    assert send("pull_request_review", review(state), f"d-{state}").status_code == 202


@pytest.mark.parametrize("action", ["edited", "dismissed"])
def test_edited_and_dismissed_reviews_never_fire(send, action):
    rule(position=0, kind="github", on_type="pull_request", actions=["review_submitted"], flow="address-review")
    assert send("pull_request_review", review(action=action), "d-x").json()["reason"] == "unhandled-event"


# --- closes -------------------------------------------------------------------------------------------------

@pytest.fixture
def close_rule():
    return rule(position=0, kind="github", on_type="issue", actions=["closed"], number=7, once=True, flow="retro")


def test_close_by_a_writer_fires_a_one_shot_job(send, forges, close_rule, redis_conn):
    forges.github_permission("acme/web", "closer-carl", "write")

    response = send("issues", issue_closed(), "d-close")

    assert response.status_code == 202
    spec = job_spec(redis_conn, "gh-d-close")
    assert spec["once"] is True and spec["once_armed_at"] == close_rule.armed_at.isoformat()
    assert spec["context"]["matched"] == {"index": 0, "type": "issue", "action": "closed", "number": 7, "once": True}
    assert spec["context"]["sender"] == {"id": "6600123"}
    assert "closer-carl" not in json.dumps(spec)  # the login only ever reaches the lookup
    assert forges.paths() == ["/repos/acme/web/collaborators/closer-carl/permission"]


def test_close_by_a_reader_is_refused(send, forges, close_rule):
    forges.github_permission("acme/web", "closer-carl", "read")
    assert send("issues", issue_closed(), "d-c").json() == {"status": "ignored", "reason": "closer-not-allowed"}


def test_close_lookup_that_cannot_be_answered_keeps_the_delivery_pending(send, forges, close_rule, redis_conn, caplog):
    forges.routes["/repos/acme/web/collaborators/closer-carl/permission"] = (502, {"message": "bad gateway"})

    with caplog.at_level("INFO"):
        response = send("issues", issue_closed(), "d-pend")

    assert response.status_code == 202 and response.json() == {"status": "accepted"}
    delivery = Delivery.objects.get(delivery_id="d-pend")
    assert (delivery.status, delivery.reason) == (DeliveryStatus.PENDING, "permission-lookup-failed")
    assert delivery.payload is not None and delivery.next_attempt_at is not None
    assert queued(redis_conn) == []
    assert "status-502" in caplog.text and "closer-carl" not in caplog.text


def test_closes_nobody_wants_cost_no_lookup(send, forges, close_rule):
    assert send("issues", issue_closed(number=8), "d-n8").json()["reason"] == "close-number-not-matched"
    assert send("issues", issue_closed(sender_id=424242), "d-self").json()["reason"] == "self"
    close_rule.delete()
    assert send("issues", issue_closed(), "d-none").json()["reason"] == "no-matching-close-trigger"
    assert forges.requests == []


def test_merged_pull_request_counts_as_closed(send, forges, redis_conn):
    rule(position=0, kind="github", on_type="pull_request", actions=["closed"], flow="release-notes")
    forges.github_permission("acme/web", "closer-carl", "admin")

    response = send("pull_request", load("github/pull_request_closed.json"), "d-merged")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert spec["context"]["matched"] == {"index": 0, "type": "pull_request", "action": "closed"}


def test_disarmed_one_shot_matches_nothing(send, forges, close_rule):
    from django.utils import timezone

    close_rule.disarmed_at = timezone.now()
    close_rule.disarmed_job_id = "gh-earlier"
    close_rule.save()

    assert send("issues", issue_closed(), "d-spent").json()["reason"] == "no-matching-close-trigger"
    assert forges.requests == []


# --- write access, not author_association ---------------------------------------------------------------------

@pytest.mark.parametrize("association", ["MEMBER", "COLLABORATOR", "OWNER"])
def test_a_trusted_association_without_write_access_is_refused(send, forges, redis_conn, association):
    """MEMBER is any member of the organisation, COLLABORATOR includes the read role: only the repository
    permission says who may write."""
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    rule(position=1, kind="github", on_type="pull_request", actions=["opened", "review_submitted"], flow="review")
    forges.github_permission("acme/web", "maintainer-mia", "read")
    forges.github_permission("acme/web", "reviewer-rita", "triage")

    answers = [
        send("issue_comment", comment(association=association), "d-w-comment").json(),
        send("pull_request", pull_request("opened", association), "d-w-pr").json(),
        send("pull_request_review", review(association=association), "d-w-review").json(),
    ]

    assert answers == [{"status": "ignored", "reason": "author-not-allowed"},
                       {"status": "ignored", "reason": "pr-author-not-allowed"},
                       {"status": "ignored", "reason": "review-author-not-allowed"}]
    assert queued(redis_conn) == []


def test_write_access_is_what_counts_whatever_the_association_says(send, forges, redis_conn):
    # A private member of the organisation shows up as CONTRIBUTOR or NONE in webhooks.
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    rule(position=1, kind="github", on_type="pull_request", actions=["opened"], flow="review")
    rule(position=2, kind="github", on_type="pull_request", actions=["review_submitted"], flow="address-review")
    forges.github_permission("acme/web", "maintainer-mia", "write")
    forges.github_permission("acme/web", "reviewer-rita", "maintain")

    assert send("issue_comment", comment(association="NONE"), "d-x-comment").status_code == 202
    assert send("pull_request", pull_request("opened", "CONTRIBUTOR"), "d-x-pr").status_code == 202
    assert send("pull_request_review", review(association="NONE"), "d-x-review").status_code == 202
    assert sorted(queued(redis_conn)) == ["gh-d-x-comment", "gh-d-x-pr", "gh-d-x-review"]


def test_the_pull_request_author_is_asked_not_the_sender(send, forges, redis_conn):
    """An automatic action runs on the author's branch and text: a writer pushing to an outsider's pull
    request does not make it theirs."""
    rule(position=0, kind="github", on_type="pull_request", actions=["synchronize"], flow="review")
    forges.github_permission("acme/web", "maintainer-mia", "admin")
    payload = pull_request("synchronize")
    payload["pull_request"]["user"] = {"login": "outside-olga", "id": 8123456, "type": "User"}

    assert send("pull_request", payload, "d-sync").json() == {"status": "ignored", "reason": "pr-author-not-allowed"}
    assert forges.paths() == ["/repos/acme/web/collaborators/outside-olga/permission"]


def test_permission_answers_are_cached_and_never_logged(send, forges, redis_conn, caplog):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    forges.github_permission("acme/web", "maintainer-mia", "write")

    with caplog.at_level("INFO"):
        send("issue_comment", comment(), "d-cache-1")
        send("issue_comment", comment(), "d-cache-2")

    assert forges.paths() == ["/repos/acme/web/collaborators/maintainer-mia/permission"]
    assert "maintainer-mia" not in caplog.text
    assert "maintainer-mia" not in json.dumps(job_spec(redis_conn, "gh-d-cache-1"))


def test_a_commenter_lookup_that_cannot_be_answered_keeps_the_delivery_pending(send, forges, redis_conn):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    forges.routes["/repos/acme/web/collaborators/maintainer-mia/permission"] = (500, {})

    assert send("issue_comment", comment(), "d-c-pend").json() == {"status": "accepted"}
    assert Delivery.objects.get(delivery_id="d-c-pend").reason == "permission-lookup-failed"
    assert queued(redis_conn) == []


def test_outsiders_text_without_the_phrase_costs_no_lookup(send, forges):
    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    rule(position=1, kind="github", on_type="pull_request", actions=["opened"], label_none=["wip"], flow="review")

    assert send("issue_comment", comment("just a note", association="NONE"), "d-free-1").json()["reason"] == \
        "no-trigger-phrase"
    assert send("pull_request", pull_request("opened", "NONE", labels=("wip",)), "d-free-2").json()["reason"] == \
        "no-matching-pr-trigger"
    assert forges.requests == []


# --- malformed but verified -----------------------------------------------------------------------------------

@pytest.mark.parametrize("event, payload, error", [
    ("pull_request", {"action": "opened", "repository": {"full_name": "acme/web"}, "sender": {"id": 1}},
     "missing-pull-request"),
    ("issue_comment", {"action": "created", "issue": {"number": 3}, "sender": {"id": 1}}, "missing-repository"),
])
def test_routed_events_without_their_object_are_400(send, event, payload, error):
    response = send(event, copy.deepcopy(payload), "d-bad")
    assert (response.status_code, response.json()) == (400, {"error": error})
