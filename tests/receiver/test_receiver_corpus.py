"""Every real GitLab, Gitea and Azure DevOps payload of tests/payloads/corpus (a copy of ../shared/corpus), replayed
through its endpoint with the headers and credentials the real forge sends: none answers 5xx, and each that should
match a test trigger does (the others are ignored for the stated reason)."""

import json
import uuid

import pytest

from tests.receiver_support import (
    AZURE_PROJECT_ID,
    CORPUS,
    GITLAB_SIGNING_SECRET,
    azure_basic_headers,
    forgejo_headers,
    gitlab_signature_headers,
    gitlab_token_headers,
    job_spec,
    post,
    rule,
)

pytestmark = pytest.mark.django_db

INDEX = json.loads((CORPUS / "index.json").read_text())

QUEUED = "queued"
EXPECTED = {
    # GitLab: older payloads carry no numeric user id and fail closed; group-level epics have no repository.
    "gitlab/confidential_issue_hook__epic_closed.json": "no-repository",
    "gitlab/confidential_issue_hook__issue_created_without_assignee.json": "missing-sender-id",
    "gitlab/confidential_issue_hook__task_event.json": "no-allowlisted-label",
    "gitlab/confidential_note_hook__issue_note.json": QUEUED,
    "gitlab/issue_hook__confidential_issue_reopened.json": "missing-sender-id",
    "gitlab/issue_hook__epic_created.json": "no-repository",
    "gitlab/issue_hook__epic_updated.json": "no-repository",
    "gitlab/issue_hook__incident_closed.json": QUEUED,
    "gitlab/issue_hook__incident_event.json": "no-allowlisted-label",
    "gitlab/issue_hook__issue_closed.json": "missing-sender-id",
    "gitlab/issue_hook__issue_created_with_hidden_comment_in_description.json": "missing-sender-id",
    "gitlab/issue_hook__issue_created_with_two_assignees.json": "missing-sender-id",
    "gitlab/issue_hook__issue_opened_with_null_description.json": "missing-sender-id",
    "gitlab/issue_hook__issue_reopened.json": "missing-sender-id",
    "gitlab/issue_hook__issue_updated.json": "missing-sender-id",
    "gitlab/issue_hook__key_result_updated.json": "no-label-change",
    "gitlab/issue_hook__objective_created_with_assignee.json": "no-allowlisted-label",
    "gitlab/issue_hook__requirement_archived.json": "no-label-change",
    "gitlab/issue_hook__task_closed.json": QUEUED,
    "gitlab/issue_hook__test_case_created.json": "no-allowlisted-label",
    "gitlab/merge_request_closed.json": "missing-sender-id",
    "gitlab/merge_request_hook__merge_request_approved.json": "missing-sender-id",
    "gitlab/merge_request_hook__merge_request_created_with_multiple_assignees.json": "missing-sender-id",
    "gitlab/merge_request_hook__merge_request_unapproved.json": "missing-sender-id",
    "gitlab/merge_request_hook__merge_request_updated.json": "missing-sender-id",
    "gitlab/merge_request_merged.json": "missing-sender-id",
    "gitlab/merge_request_reopened.json": "missing-sender-id",
    "gitlab/note_hook__commit_note.json": "unhandled-event",
    "gitlab/note_hook__issue_note.json": QUEUED,
    "gitlab/note_hook__merge_request_note.json": "no-trigger-phrase",
    "gitlab/note_hook__snippet_note.json": "unhandled-event",
    "gitlab/system_hook__merge_request_created_with_assignee.json": "missing-sender-id",
    # Gitea (served on /hooks/forgejo)
    "gitea/issue_comment__deleted_pr.json": "unhandled-event",
    "gitea/issue_comment__edited.json": "action-not-actionable",
    "gitea/issue_comment__in_pr.json": QUEUED,
    "gitea/issue_comment__new.json": QUEUED,
    "gitea/issues__assigned.json": "action-not-actionable",
    "gitea/issues__closed.json": QUEUED,
    "gitea/issues__edited.json": "action-not-actionable",
    "gitea/issues__opened.json": "no-allowlisted-label",
    "gitea/issues__reopened.json": "no-allowlisted-label",
    "gitea/pull_request__assigned.json": "action-not-actionable",
    "gitea/pull_request__closed.json": QUEUED,
    "gitea/pull_request__closed_diff_user.json": QUEUED,
    "gitea/pull_request__edited.json": "action-not-actionable",
    "gitea/pull_request__merged.json": QUEUED,
    "gitea/pull_request__opened.json": QUEUED,
    "gitea/pull_request__synchronized.json": QUEUED,
    "gitea/pull_request_comment__created.json": "no-trigger-phrase",
    # Azure DevOps: a merge is no trigger event
    "azure/code_pull_request__merge_attempted.json": "unhandled-event",
    "azure/code_pull_request__merged.json": "unhandled-event",
    "azure/code_pull_request__opened.json": QUEUED,
    "azure/code_pull_request__opened_without_description.json": QUEUED,
    "azure/code_pull_request__updated.json": QUEUED,
}


def test_the_expectations_cover_the_whole_corpus():
    assert sorted(EXPECTED) == sorted(entry["file"] for entry in INDEX)


@pytest.fixture
def test_triggers(forges):
    """What an operator of these projects would configure, and the forges' answers for their members."""
    rule(position=0, kind="gitlab", on_type="label", label_any=["bug"], flow="fix-bug")
    rule(position=1, kind="gitlab", on_type="comment", phrase="comment", flow="triage")
    rule(position=2, kind="gitlab", on_type="issue", actions=["close"], flow="retro")
    rule(position=3, kind="gitlab", on_type="pull_request", actions=["open", "reopen", "approved", "update"],
         flow="review")
    rule(position=4, kind="forgejo", on_type="label", label_any=["bug"], flow="fix-bug")
    rule(position=5, kind="forgejo", on_type="comment", phrase="comment", flow="triage")
    rule(position=6, kind="forgejo", on_type="issue", actions=["closed"], flow="retro")
    rule(position=7, kind="forgejo", on_type="pull_request", actions=["closed"], flow="release-notes")
    rule(position=8, kind="forgejo", on_type="pull_request", actions=["opened", "synchronized"], flow="review")
    rule(position=9, kind="azure", on_type="pull_request", actions=["created", "updated"], flow="review")
    forges.gitlab_member("46186758", 14613894, 40)
    forges.gitlab_member("80222147", 34850171, 30)
    for repo, login in (("kostekIV/test", "kostekIV"), ("Aneesh-Hegde/test-repo", "Aneesh-Hegde"),
                        ("Aneesh-Hegde/gitea-webhook", "Aneesh-Hegde")):
        forges.forgejo_permission(repo, login, "write")
    forges.azure_member("107e08c7-2725-675e-a1b0-281729035ea6", project_id=AZURE_PROJECT_ID)
    return forges


def corpus_request(entry: dict, mode: str = "token"):
    """(path, body, headers) exactly as the forge would deliver the file's bytes."""
    body = (CORPUS / entry["file"]).read_bytes()
    delivery = str(uuid.uuid4())
    if entry["forge"] == "gitlab":
        if mode == "signature":
            return "gitlab", body, gitlab_signature_headers(body, entry["event_header"], delivery)
        return "gitlab", body, gitlab_token_headers(entry["event_header"], delivery)
    if entry["forge"] == "gitea":
        gogs = "Gogs" in entry["summary"]
        headers = forgejo_headers(body, entry["event_header"], delivery, flavour="gitea",
                                  event_type=("pull_request_comment" if "pull_request_comment" in entry["file"]
                                              else None))
        if gogs:  # Gogs names its headers X-Gogs-*
            headers = {k: v for k, v in headers.items() if k.startswith("X-Gogs-")}
        return "forgejo", body, headers
    return "azure", body, azure_basic_headers()


def outcome(response) -> str:
    answer = response.json()
    return answer.get("reason") or answer.get("status") or answer.get("error")


@pytest.mark.parametrize("entry", INDEX, ids=[entry["file"] for entry in INDEX])
def test_corpus_payload(client, test_triggers, redis_conn, entry):
    forge, body, headers = corpus_request(entry)

    response = post(client, forge, body, headers)

    assert response.status_code < 500
    assert outcome(response) == EXPECTED[entry["file"]], response.json()
    if EXPECTED[entry["file"]] == QUEUED:
        spec = job_spec(redis_conn, response.json()["jobs"][0])
        assert spec["kind"] == {"gitlab": "gitlab", "gitea": "forgejo", "azure": "azure"}[entry["forge"]]
        assert spec["number"] >= 1 and spec["repo"]


def test_gitlab_corpus_in_signature_mode(client, test_triggers, settings, redis_conn):
    settings.GITLAB_WEBHOOK_MODE = "signature"
    settings.GITLAB_WEBHOOK_SECRET = GITLAB_SIGNING_SECRET
    for entry in (entry for entry in INDEX if entry["forge"] == "gitlab"):
        redis_conn.flushdb()  # each file is its own story; no dedup window between them
        forge, body, headers = corpus_request(entry, mode="signature")
        response = post(client, forge, body, headers)
        assert outcome(response) == EXPECTED[entry["file"]], entry["file"]
