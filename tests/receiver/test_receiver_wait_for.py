"""A trigger's `run.waitFor` reaches its job on every route of every forge (label, comment, pull request,
close), from each forge's real payload shape, and sends the job to a live host that offers its check."""

import json

import pytest

from tests.fleet_support import publish
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
    queued,
    rule,
)

pytestmark = pytest.mark.django_db

WAIT_FOR = [{"profile": "ci-green"}, {"after": "2026-01-01T00:00:00Z"}]
CHECKING_HOST = "hostW"
GITLAB_ACTOR, AZURE_ACTOR, AZURE_PR_AUTHOR = 1201, "54d125f7-69f7-4191-904f-c5b96b6261c8", \
    "107e08c7-2725-675e-a1b0-281729035ea6"


def github(forges, delivery):
    forges.github_permission("acme/web", "maintainer-mia", "write")
    forges.github_permission("acme/web", "closer-carl", "write")
    label = load("github/issues_labeled.json")
    label["issue"]["labels"] = [{"name": "pi"}]
    comment = load("github/issue_comment_created.json")
    comment["comment"]["body"] = "@pi please take this one"
    opened = load("github/pull_request_opened.json")
    closed = load("github/pull_request_closed.json")
    return {
        "label": ({"on_type": "label", "label_any": ["pi"]}, "issues", label),
        "comment": ({"on_type": "comment", "phrase": "@pi"}, "issue_comment", comment),
        "pull_request": ({"on_type": "pull_request", "actions": ["opened"]}, "pull_request", opened),
        "close": ({"on_type": "pull_request", "actions": ["closed"]}, "pull_request", closed),
    }


def gitlab(forges, delivery):
    forges.gitlab_member("4711", GITLAB_ACTOR, 30)
    label = load("gitlab/issue_update_labels.json")
    merge_request = load("gitlab/merge_request_update_labels.json")
    closed = load("gitlab/merge_request_update_labels.json")
    closed["object_attributes"]["action"] = "close"
    return {
        "label": ({"on_type": "label", "label_any": ["pi"]}, "Issue Hook", label),
        "comment": ({"on_type": "comment", "phrase": "@pi"}, "Note Hook", load("gitlab/note_issue.json")),
        "pull_request": ({"on_type": "pull_request", "actions": ["update"], "label_any": ["pi-review"]},
                         "Merge Request Hook", merge_request),
        "close": ({"on_type": "pull_request", "actions": ["close"]}, "Merge Request Hook", closed),
    }


def forgejo(forges, delivery):
    forges.forgejo_permission("acme/web", "maintainer-mia", "write")
    comment = {
        "action": "created", "is_pull": False,
        "issue": {"id": 9, "number": 3, "title": "Checkout bar", "body": "...", "labels": []},
        "comment": {"id": 55, "body": "@pi have a look", "user": {"id": 2101, "login": "maintainer-mia"}},
        "repository": {"id": 77, "full_name": "acme/web"},
        "sender": {"id": 2101, "login": "maintainer-mia", "username": "maintainer-mia"},
    }
    merged = load("forgejo/pull_request_label_updated.json")
    merged["action"] = "closed"
    merged["pull_request"].update(merged=True, state="closed")
    return {
        "label": ({"on_type": "label", "label_any": ["pi"]}, "issues", load("forgejo/issues_label_updated.json")),
        "comment": ({"on_type": "comment", "phrase": "@pi"}, "issue_comment", comment),
        "pull_request": ({"on_type": "pull_request", "actions": ["label_updated"], "label_any": ["pi-review"]},
                         "pull_request", load("forgejo/pull_request_label_updated.json")),
        "close": ({"on_type": "pull_request", "actions": ["closed"]}, "pull_request", merged),
    }


def azure(forges, delivery):
    forges.azure_member(AZURE_ACTOR)
    forges.azure_member(AZURE_PR_AUTHOR)
    opened = json.loads((CORPUS / "azure" / "code_pull_request__opened.json").read_text())
    on_repo = {"repository": "storefront"}
    return {
        "label": ({"on_type": "label", "label_any": ["pi-fix"], **on_repo}, None,
                  load("azure/workitem_updated_tags.json")),
        "comment": ({"on_type": "comment", "phrase": "@pi", **on_repo}, None, load("azure/pullrequest_comment.json")),
        "pull_request": ({"on_type": "pull_request", "actions": ["created"]}, None, opened),
    }


ROUTES = [("github", route) for route in ("label", "comment", "pull_request", "close")] + \
         [("gitlab", route) for route in ("label", "comment", "pull_request", "close")] + \
         [("forgejo", route) for route in ("label", "comment", "pull_request", "close")] + \
         [("azure", route) for route in ("label", "comment", "pull_request")]  # Azure sends no close event


def deliver(client, forge, event, payload, delivery):
    if forge == "azure":
        return post(client, "azure", dumps({**payload, "id": delivery}), azure_basic_headers())
    body = dumps(payload)
    headers = {"github": lambda: github_headers(body, event, delivery),
               "gitlab": lambda: gitlab_token_headers(event, delivery),
               "forgejo": lambda: forgejo_headers(body, event, delivery)}[forge]()
    return post(client, forge, body, headers)


@pytest.mark.parametrize("forge, route", ROUTES, ids=[f"{forge}-{route}" for forge, route in ROUTES])
def test_wait_conditions_reach_the_job_and_route_it_to_a_host_that_can_check_them(
        client, forges, redis_conn, fast_fleet, forge, route):
    publish(redis_conn, CHECKING_HOST, capabilities=["wait:ci-green"])
    publish(redis_conn, "hostPlain")  # live too, but it cannot run the check
    delivery = f"wait-{forge}-{route}"
    fields, event, payload = {"github": github, "gitlab": gitlab, "forgejo": forgejo, "azure": azure}[forge](
        forges, delivery)[route]
    rule(position=0, kind=forge, flow="fix-bug", wait_for=WAIT_FOR, **fields)

    response = deliver(client, forge, event, payload, delivery)

    assert response.status_code == 202 and response.json()["status"] == "queued", response.content
    (job_id,) = response.json()["jobs"]
    spec = job_spec(redis_conn, job_id, f"pi-jobs@{CHECKING_HOST}")
    assert list(spec["wait_for"]) == WAIT_FOR
    assert queued(redis_conn) == []  # not the shared queue, where a host without the check could take it
