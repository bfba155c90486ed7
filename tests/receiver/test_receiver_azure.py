"""Azure DevOps routes and gates: work item tags added, comments, pull requests, project membership."""

import json

import pytest

from apps.receiver.models import Delivery
from tests.receiver_support import AZURE_PROJECT_ID, CORPUS, azure_basic_headers, dumps, job_spec, load, post, rule

pytestmark = pytest.mark.django_db

JAMAL = "54d125f7-69f7-4191-904f-c5b96b6261c8"
YURO = "107e08c7-2725-675e-a1b0-281729035ea6"


@pytest.fixture
def send(client, forges):
    def send(payload, delivery=None):
        if delivery:
            payload = {**payload, "id": delivery}
        return post(client, "azure", dumps(payload), azure_basic_headers())

    return send


@pytest.fixture
def member(forges):
    forges.azure_member(JAMAL)
    return forges


def created(tags="frontend; pi-fix"):
    payload = load("azure/workitem_commented.json")
    payload["eventType"] = "workitem.created"
    payload["resource"]["rev"] = 1
    payload["resource"]["fields"]["System.Tags"] = tags
    del payload["resource"]["fields"]["System.History"]
    return payload


def test_added_tag_fires_a_label_rule_on_the_rules_repository(send, member, redis_conn):
    rule(position=0, kind="azure", on_type="label", label_any=["pi-fix"], repository="storefront", flow="fix-bug")

    response = send(load("azure/workitem_updated_tags.json"))

    job_id = "az-27646e0e-b520-4d2b-9411-bba7524947cd"
    assert response.json() == {"status": "queued", "jobs": [job_id]}
    spec = job_spec(redis_conn, job_id)
    assert (spec["repo"], spec["number"], spec["target_type"]) == ("Fabrikam-Fiber-Git/storefront", 5, "issue")
    assert spec["project_id"] == AZURE_PROJECT_ID
    assert spec["context"]["sender"] == {"id": JAMAL}
    assert spec["context"]["matched"] == {"index": 0, "type": "label", "label": "pi-fix"}
    assert "fabrikamfiber4" not in json.dumps(spec)


def test_tags_already_there_do_not_fire(send, member):
    rule(position=0, kind="azure", on_type="label", label_any=["frontend"], repository="storefront", flow="fix-bug")
    assert send(load("azure/workitem_updated_tags.json")).json()["reason"] == "no-allowlisted-label"


def test_updates_without_tag_additions(send, member):
    rule(position=0, kind="azure", on_type="label", label_any=["pi-fix"], repository="storefront", flow="fix-bug")
    payload = load("azure/workitem_updated_tags.json")
    payload["resource"]["fields"]["System.Tags"] = {"oldValue": "frontend; pi-fix", "newValue": "frontend"}
    assert send(payload, "removed").json()["reason"] == "no-label-change"
    del payload["resource"]["fields"]["System.Tags"]
    assert send(payload, "other-field").json()["reason"] == "no-label-change"


def test_created_work_item_uses_its_whole_tag_set(send, forges, redis_conn):
    rule(position=0, kind="azure", on_type="label", label_any=["pi-fix"], repository="storefront", flow="fix-bug")
    # No GUID on a created work item: the actor is the email of System.ChangedBy, asked for by email.
    forges.azure_member(JAMAL)
    forges.routes["/_apis/graph/users"] = (200, {"value": [
        {"principalName": "fabrikamfiber4@hotmail.com", "descriptor": f"aad.{JAMAL[:8]}"}]})

    response = send(created(), "created-1")

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert spec["context"]["sender"]["id"].startswith("azid-")  # a pseudonym, never the address
    assert spec["context"]["matched"]["label"] == "pi-fix"


def test_work_item_comment(send, forges, redis_conn):
    rule(position=0, kind="azure", on_type="comment", phrase="@pi", repository="storefront", flow="fix-bug")
    forges.azure_member(JAMAL)
    forges.routes["/_apis/graph/users"] = (200, {"value": [
        {"mailAddress": "FabrikamFiber4@hotmail.com", "descriptor": f"aad.{JAMAL[:8]}"}]})

    spec = job_spec(redis_conn, send(load("azure/workitem_commented.json")).json()["jobs"][0])

    assert (spec["comment"], spec["context"]["action"]) == ("@pi please fix", "commented")


def test_pull_request_comment_takes_the_repository_from_the_payload(send, member, redis_conn):
    rule(position=0, kind="azure", on_type="comment", phrase="@pi", repository="storefront", flow="review")

    spec = job_spec(redis_conn, send(load("azure/pullrequest_comment.json")).json()["jobs"][0])

    assert (spec["repo"], spec["target_type"], spec["number"]) == ("Fabrikam-Fiber-Git/Fabrikam", "pull_request", 1)
    assert spec["repository_id"] == "4bc14d40-c903-45e2-872e-0462c7748079"
    assert (spec["head"], spec["base"]) == ({"ref": "sticky-bar"}, {"ref": "main"})


@pytest.mark.parametrize("group", ["Readers", "Project Valid Users", "Stakeholders (read-only)"])
def test_members_of_other_groups_are_refused(send, forges, group):
    rule(position=0, kind="azure", on_type="comment", phrase="@pi", repository="storefront", flow="review")
    forges.azure_member(JAMAL, group=group)
    assert send(load("azure/pullrequest_comment.json")).json()["reason"] == "author-not-allowed"


def test_membership_lookup_that_fails_keeps_the_delivery(send, forges):
    rule(position=0, kind="azure", on_type="comment", phrase="@pi", repository="storefront", flow="review")
    forges.routes[f"/_apis/graph/descriptors/{JAMAL}"] = (503, {})
    assert send(load("azure/pullrequest_comment.json")).json() == {"status": "accepted"}
    assert Delivery.objects.get().reason == "membership-lookup-failed"


def test_pull_request_created_rule(send, forges, redis_conn):
    rule(position=0, kind="azure", on_type="pull_request", actions=["created"], flow="review")
    forges.azure_member(YURO)
    corpus_pr = json.loads((CORPUS / "azure" / "code_pull_request__opened.json").read_text())

    spec = job_spec(redis_conn, send(corpus_pr).json()["jobs"][0])

    assert (spec["repo"], spec["number"]) == ("test-zulip/test-zulip", 1)
    assert spec["context"]["matched"] == {"index": 0, "type": "pull_request", "action": "created"}


def test_self_by_guid(send, forges, settings):
    rule(position=0, kind="azure", on_type="comment", phrase="@pi", repository="storefront", flow="review")
    settings.AZURE_SELF_ID = JAMAL.upper()
    assert send(load("azure/pullrequest_comment.json")).json()["reason"] == "self"
    assert forges.requests == []


def test_self_by_email(send, forges, settings):
    rule(position=0, kind="azure", on_type="comment", phrase="@pi", repository="storefront", flow="review")
    settings.AZURE_SELF_EMAIL = "FabrikamFiber4@hotmail.com"
    assert send(load("azure/workitem_commented.json")).json()["reason"] == "self"


def test_work_item_without_any_identity_fails_closed(send, member):
    rule(position=0, kind="azure", on_type="label", label_any=["pi-fix"], repository="storefront", flow="fix-bug")
    payload = created()
    payload["resource"]["fields"]["System.ChangedBy"] = "Jamal Hartnett"  # a display name is no identity
    payload["resource"]["fields"]["System.CreatedBy"] = "Jamal Hartnett"
    assert send(payload, "noid").json()["reason"] == "missing-sender-id"


def test_other_event_types_are_unhandled(send, member):
    payload = load("azure/workitem_commented.json")
    payload["eventType"] = "workitem.deleted"
    assert send(payload, "del").json()["reason"] == "unhandled-event"
