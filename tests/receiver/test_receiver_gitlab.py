"""GitLab routes and gates: added labels only, merge requests, notes, closes, and the member lookup."""

import copy

import pytest

from apps.receiver.models import Delivery, DeliveryStatus
from tests.receiver_support import dumps, gitlab_token_headers, job_spec, load, post, queued, rule

pytestmark = pytest.mark.django_db

MIA = 1201  # the actor of the fixtures


@pytest.fixture
def send(client, forges):
    def send(payload, delivery, event=None):
        body = dumps(payload)
        hook = event or {"issue": "Issue Hook", "merge_request": "Merge Request Hook", "note": "Note Hook"}.get(
            payload.get("object_kind"), "Issue Hook")
        return post(client, "gitlab", body, gitlab_token_headers(hook, delivery))

    return send


@pytest.fixture
def developer(forges):
    forges.gitlab_member("4711", MIA, 30)
    return forges


def labelled_issue(previous=("bug",), current=("bug", "pi"), action="update"):
    payload = load("gitlab/issue_update_labels.json")
    payload["object_attributes"]["action"] = action
    as_labels = lambda names: [{"id": i, "title": name, "type": "ProjectLabel"} for i, name in enumerate(names)]  # noqa: E731
    payload["changes"]["labels"] = {"previous": as_labels(previous), "current": as_labels(current)}
    payload["object_attributes"]["labels"] = as_labels(current)
    payload["labels"] = as_labels(current)
    return payload


def test_added_label_fires_for_a_developer(send, developer, redis_conn):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")

    response = send(labelled_issue(), "idem-1")

    assert response.json() == {"status": "queued", "jobs": ["gl-idem-1"]}
    spec = job_spec(redis_conn, "gl-idem-1")
    assert (spec["repo"], spec["number"], spec["project_id"]) == ("acme/shop/storefront", 5, "4711")
    assert spec["context"]["matched"] == {"index": 0, "type": "label", "label": "pi"}
    assert developer.paths() == [f"/api/v4/projects/4711/members/all/{MIA}"]


def test_labels_already_there_do_not_fire_again(send, developer):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    # `pi` was already on the issue; this event only added `frontend`.
    response = send(labelled_issue(previous=("pi",), current=("pi", "frontend")), "idem-2")
    assert response.json() == {"status": "ignored", "reason": "no-allowlisted-label"}


def test_removing_a_label_never_fires(send, developer):
    rule(position=0, kind="gitlab", on_type="label", label_none=["wip"], label_any=["pi"], flow="fix-bug")
    response = send(labelled_issue(previous=("pi", "wip"), current=("pi",)), "idem-3")
    assert response.json() == {"status": "ignored", "reason": "no-label-change"}


def test_an_update_without_label_changes(send, developer):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    payload = labelled_issue()
    del payload["changes"]["labels"]
    assert send(payload, "idem-4").json()["reason"] == "no-label-change"


def test_opened_issue_uses_its_whole_label_set(send, developer, redis_conn):
    rule(position=0, kind="gitlab", on_type="label", label_all=["bug", "pi"], flow="fix-bug")
    payload = labelled_issue(action="open")
    del payload["changes"]["labels"]
    assert send(payload, "idem-open").status_code == 202


@pytest.mark.parametrize("level", [10, 20])
def test_reporters_and_guests_are_refused(send, forges, level):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    forges.gitlab_member("4711", MIA, level)
    assert send(labelled_issue(), "idem-g").json() == {"status": "ignored", "reason": "author-not-allowed"}


def test_non_member_is_refused(send, forges):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    assert send(labelled_issue(), "idem-nm").json()["reason"] == "author-not-allowed"  # the lookup answered 404


def test_member_lookup_that_fails_keeps_the_delivery(send, forges, redis_conn):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    forges.routes[f"/api/v4/projects/4711/members/all/{MIA}"] = (500, {"message": "500 Internal Server Error"})

    response = send(labelled_issue(), "idem-500")

    assert response.json() == {"status": "accepted"}
    delivery = Delivery.objects.get(delivery_id="idem-500")
    assert (delivery.status, delivery.reason) == (DeliveryStatus.PENDING, "access-lookup-failed")
    assert queued(redis_conn) == []


def test_events_nobody_wants_cost_no_lookup(send, forges):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    send(labelled_issue(previous=(), current=("docs",)), "idem-docs")
    send({**load("gitlab/note_issue.json")}, "idem-note")
    assert forges.requests == []


# --- merge requests ---------------------------------------------------------------------------------------------

def test_merge_request_label_rule_sees_only_added_labels(send, developer, redis_conn):
    rule(position=0, kind="gitlab", on_type="pull_request", actions=["update"], label_any=["pi-review"], flow="review")

    response = send(load("gitlab/merge_request_update_labels.json"), "idem-mr")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert (spec["target_type"], spec["number"]) == ("pull_request", 5)
    assert spec["context"]["matched"] == {"index": 0, "type": "label", "label": "pi-review"}

    payload = load("gitlab/merge_request_update_labels.json")
    payload["changes"]["labels"]["previous"] = payload["changes"]["labels"]["current"]
    assert send(payload, "idem-mr2").json()["reason"] == "no-matching-pr-trigger"


@pytest.mark.parametrize("action", ["open", "reopen", "approved", "update"])
def test_unpredicated_merge_request_rules_fire_on_the_action(send, developer, redis_conn, action):
    rule(position=0, kind="gitlab", on_type="pull_request", actions=["open", "reopen", "approved", "update"],
         flow="review")
    payload = load("gitlab/merge_request_update_labels.json")
    payload["object_attributes"]["action"] = action

    response = send(payload, f"idem-{action}")

    assert job_spec(redis_conn, response.json()["jobs"][0])["context"]["matched"] == {
        "index": 0, "type": "pull_request", "action": action}


@pytest.mark.parametrize("action", ["merge", "unapproved", "approval"])
def test_merge_and_other_mr_actions_never_fire(send, developer, action):
    rule(position=0, kind="gitlab", on_type="pull_request", actions=["close"], flow="retro")
    payload = load("gitlab/merge_request_update_labels.json")
    payload["object_attributes"]["action"] = action
    assert send(payload, f"idem-{action}").json()["reason"] == "unhandled-event"


def test_issue_and_merge_request_numbers_do_not_collide(send, developer, redis_conn):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    rule(position=1, kind="gitlab", on_type="pull_request", actions=["update"], label_any=["pi-review"], flow="fix-bug")

    issue = send(labelled_issue(), "idem-i5").json()
    merge_request = send(load("gitlab/merge_request_update_labels.json"), "idem-m5").json()

    assert issue["status"] == merge_request["status"] == "queued"  # #5 and !5 are different targets


# --- notes ---------------------------------------------------------------------------------------------------

def test_note_on_an_issue_with_the_phrase(send, developer, redis_conn):
    rule(position=0, kind="gitlab", on_type="comment", phrase="@pi", flow="fix-bug")
    rule(position=1, kind="github", on_type="label", label_any=["x"], flow="triage")

    response = send(load("gitlab/note_issue.json"), "idem-n1")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert (spec["flow"], spec["target_type"], spec["number"]) == ("triage", "issue", 5)  # `@pi triage`
    assert spec["context"]["comment"] == {"body": "@pi triage please"}


def test_note_on_a_merge_request_targets_it(send, developer, redis_conn):
    rule(position=0, kind="gitlab", on_type="comment", phrase="@pi", flow="fix-bug")
    payload = load("gitlab/note_issue.json")
    payload["object_attributes"]["noteable_type"] = "MergeRequest"
    payload["merge_request"] = {"iid": 9, "title": "Sticky bar", "description": "..."}
    del payload["issue"]

    spec = job_spec(redis_conn, send(payload, "idem-n2").json()["jobs"][0])

    assert (spec["target_type"], spec["number"]) == ("pull_request", 9)


@pytest.mark.parametrize("noteable", ["Commit", "Snippet"])
def test_notes_on_commits_and_snippets_are_unhandled(send, developer, noteable):
    rule(position=0, kind="gitlab", on_type="comment", phrase="@pi", flow="fix-bug")
    payload = load("gitlab/note_issue.json")
    payload["object_attributes"]["noteable_type"] = noteable
    assert send(payload, f"idem-{noteable}").json()["reason"] == "unhandled-event"


# --- closes ----------------------------------------------------------------------------------------------------

def test_close_fires_a_close_rule_and_the_merge_does_not(send, developer, redis_conn):
    rule(position=0, kind="gitlab", on_type="pull_request", actions=["close"], flow="retro")
    payload = load("gitlab/merge_request_update_labels.json")
    payload["object_attributes"]["action"] = "close"

    spec = job_spec(redis_conn, send(payload, "idem-close").json()["jobs"][0])
    assert spec["context"]["matched"] == {"index": 0, "type": "pull_request", "action": "close"}

    payload["object_attributes"]["action"] = "merge"
    assert send(payload, "idem-merge").json()["reason"] == "unhandled-event"


def test_close_that_also_labels_falls_back_to_the_label_rule_once(send, developer, redis_conn):
    rule(position=0, kind="gitlab", on_type="issue", actions=["close"], number=99, flow="retro")
    rule(position=1, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")

    response = send(labelled_issue(action="close"), "idem-cl")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert spec["flow"] == "fix-bug" and len(response.json()["jobs"]) == 1


def test_self_is_checked_before_any_lookup(send, forges):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    payload = labelled_issue()
    payload["user"]["id"] = 900001
    assert send(payload, "idem-self").json()["reason"] == "self"
    payload = copy.deepcopy(payload)
    payload["user"] = {"name": "Someone", "username": "someone"}  # older GitLab: no numeric id
    assert send(payload, "idem-noid").json()["reason"] == "missing-sender-id"
    assert forges.requests == []


def test_group_level_work_items_have_no_repository(send, developer):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug")
    payload = labelled_issue(action="open")
    payload["object_kind"] = "work_item"
    payload["project"] = None
    assert send(payload, "idem-epic").json()["reason"] == "no-repository"
