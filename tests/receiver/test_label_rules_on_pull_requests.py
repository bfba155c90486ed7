"""A Label trigger fires when a pull or merge request gets a label, on every forge that sends one, as it does for
an issue: GitHub `pull_request` labeled, GitLab `merge_request` update with a label added, Forgejo/Gitea
`label_updated`, Azure DevOps a pull request created with labels. Each forge's real payload (tests/payloads/corpus/,
or the forge's fixture beside it) with only the labels set."""

import copy
import json
import uuid

import pytest

from tests.receiver_support import (
    CORPUS,
    azure_basic_headers,
    dumps,
    forgejo_headers,
    github_headers,
    gitlab_token_headers,
    job_spec,
    load,
    post,
    rule,
)

pytestmark = pytest.mark.django_db

GITLAB_PROJECT = "1534233"  # the corpus merge request's target project
AZURE_AUTHOR = "107e08c7-2725-675e-a1b0-281729035ea6"  # the corpus pull requests' author


def corpus(name: str) -> dict:
    return json.loads((CORPUS / name).read_text())


def answer(response) -> str:
    return response.json().get("reason") or response.json()["status"]


# --- GitHub --------------------------------------------------------------------------------------------------

def github_pull(action: str, labels=("pi",)) -> dict:
    payload = load("github/pull_request_opened.json")
    payload["action"] = action
    payload["pull_request"]["labels"] = [{"id": i, "name": name} for i, name in enumerate(labels)]
    return payload


def send_github(client, payload) -> object:
    body = dumps(payload)
    delivery = str(uuid.uuid4())
    return post(client, "github", body, github_headers(body, "pull_request", delivery))


def test_github_pull_request_labelled_fires_a_label_rule_without_a_lookup(client, forges, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="review")

    response = send_github(client, github_pull("labeled"))

    assert answer(response) == "queued"
    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert (spec["repo"], spec["number"], spec["target_type"]) == ("acme/web", 12, "pull_request")
    assert spec["context"]["matched"] == {"index": 0, "type": "label", "label": "pi"}
    assert forges.paths() == []  # applying a label is the approval, as on an issue


def test_github_push_to_a_labelled_pull_request_does_not_fire_the_label_rule(client, forges):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="review")

    assert answer(send_github(client, github_pull("synchronize"))) == "no-matching-pr-trigger"
    assert answer(send_github(client, github_pull("labeled", labels=("docs",)))) == "no-matching-pr-trigger"


def test_github_pull_request_opened_with_the_label_asks_the_openers_access(client, forges, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="review")
    forges.github_permission("acme/web", "maintainer-mia", "read")

    assert answer(send_github(client, github_pull("opened"))) == "author-not-allowed"


def test_the_first_rule_in_file_order_wins_whichever_its_type(client, forges, redis_conn):
    rule(position=0, kind="github", on_type="pull_request", actions=["labeled"], label_any=["pi"], flow="triage")
    rule(position=1, kind="github", on_type="label", label_any=["pi"], flow="review")

    response = send_github(client, github_pull("labeled"))

    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert spec["flow"] == "triage"
    assert spec["context"]["matched"] == {"index": 0, "type": "pull_request", "action": "labeled"}


# --- GitLab --------------------------------------------------------------------------------------------------

def send_gitlab(client, payload) -> object:
    return post(client, "gitlab", dumps(payload), gitlab_token_headers("Merge Request Hook", str(uuid.uuid4())))


def gitlab_merge_request_update(previous=(), current=("pi",)) -> dict:
    """The corpus's real merge request update (a push), with a numeric user id and, when given, a label edit."""
    payload = copy.deepcopy(corpus("gitlab/merge_request_hook__merge_request_updated.json"))
    payload["user"]["id"] = 1201
    as_labels = lambda names: [{"id": i, "title": name, "type": "ProjectLabel"} for i, name in enumerate(names)]  # noqa: E731
    if previous != current:
        payload.setdefault("changes", {})["labels"] = {"previous": as_labels(previous), "current": as_labels(current)}
    payload["labels"] = as_labels(current)
    return payload


def test_gitlab_merge_request_labelled_fires_a_label_rule(client, forges, redis_conn):
    """The reported case: a merge request labelled `pi` was answered `ignored no-matching-pr-trigger`."""
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="review")
    payload = gitlab_merge_request_update()
    forges.gitlab_member(GITLAB_PROJECT, 1201, 30)

    response = send_gitlab(client, payload)

    assert answer(response) == "queued", response.json()
    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert (spec["target_type"], spec["number"]) == ("pull_request", payload["object_attributes"]["iid"])
    assert spec["context"]["matched"] == {"index": 0, "type": "label", "label": "pi"}


def test_gitlab_label_fixture_fires_and_other_edits_do_not(client, forges, redis_conn):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi-review"], flow="review")
    forges.gitlab_member("4711", 1201, 30)

    assert answer(send_gitlab(client, load("gitlab/merge_request_update_labels.json"))) == "queued"
    # A push to the labelled merge request (no label edit): the label was there before, nothing fires.
    pushed = gitlab_merge_request_update(previous=("pi-review",), current=("pi-review",))
    forges.gitlab_member(GITLAB_PROJECT, 1201, 30)
    assert answer(send_gitlab(client, pushed)) == "no-matching-pr-trigger"


def test_gitlab_label_rules_answer_only_to_members(client, forges):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="review")
    payload = gitlab_merge_request_update()
    forges.gitlab_member(GITLAB_PROJECT, 1201, 10)  # a guest

    assert answer(send_gitlab(client, payload)) == "author-not-allowed"


# --- Forgejo and Gitea ---------------------------------------------------------------------------------------

def send_forgejo(client, payload, flavour="forgejo") -> object:
    body = dumps(payload)
    return post(client, "forgejo", body, forgejo_headers(body, "pull_request", str(uuid.uuid4()), flavour=flavour))


def test_forgejo_label_updated_on_a_pull_request_fires_a_label_rule(client, forges, redis_conn):
    rule(position=0, kind="forgejo", on_type="label", label_any=["pi-review"], flow="review")
    forges.forgejo_permission("acme/web", "maintainer-mia", "write")

    response = send_forgejo(client, load("forgejo/pull_request_label_updated.json"))

    assert answer(response) == "queued"
    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert spec["target_type"] == "pull_request"
    assert spec["context"]["matched"]["type"] == "label"


def test_gitea_corpus_pull_request_labelled_fires_and_a_push_does_not(client, forges, redis_conn):
    rule(position=0, kind="forgejo", on_type="label", label_any=["pi"], flow="review")
    forges.forgejo_permission("kostekIV/test", "kostekIV", "write")
    labelled = corpus("gitea/pull_request__opened.json")
    labelled["action"] = "label_updated"
    labelled["pull_request"]["labels"] = [{"id": 1, "name": "pi", "color": "00aabb"}]

    assert answer(send_forgejo(client, labelled, flavour="gitea")) == "queued"

    pushed = corpus("gitea/pull_request__opened.json")
    pushed["action"] = "synchronized"
    pushed["pull_request"]["labels"] = [{"id": 1, "name": "pi", "color": "00aabb"}]
    assert answer(send_forgejo(client, pushed, flavour="gitea")) == "no-matching-pr-trigger"


# --- Azure DevOps --------------------------------------------------------------------------------------------

def send_azure(client, payload) -> object:
    return post(client, "azure", dumps({**payload, "id": str(uuid.uuid4())}), azure_basic_headers())


def azure_pull(name: str, labels) -> dict:
    payload = corpus(name)
    payload["resource"]["labels"] = [{"id": str(uuid.uuid4()), "name": name, "active": active}
                                     for name, active in labels]
    return payload


def test_azure_pull_request_created_with_a_label_fires_a_label_rule(client, forges, redis_conn):
    rule(position=0, kind="azure", on_type="label", label_any=["pi"], repository="test-zulip", flow="review")
    forges.azure_member(AZURE_AUTHOR)

    response = send_azure(client, azure_pull("azure/code_pull_request__opened.json", [("pi", True)]))

    assert answer(response) == "queued", response.json()
    spec = job_spec(redis_conn, response.json()["jobs"][0])
    assert (spec["repo"], spec["target_type"]) == ("test-zulip/test-zulip", "pull_request")
    assert spec["context"]["matched"] == {"index": 0, "type": "label", "label": "pi"}


def test_azure_inactive_labels_and_updates_do_not_fire(client, forges):
    rule(position=0, kind="azure", on_type="label", label_any=["pi"], repository="test-zulip", flow="review")
    forges.azure_member(AZURE_AUTHOR)

    removed = azure_pull("azure/code_pull_request__opened.json", [("pi", False)])
    assert answer(send_azure(client, removed)) == "no-matching-pr-trigger"
    # Azure sends no label diff with an update: the labels already there must not fire on every push.
    updated = azure_pull("azure/code_pull_request__updated.json", [("pi", True)])
    assert answer(send_azure(client, updated)) == "no-matching-pr-trigger"
