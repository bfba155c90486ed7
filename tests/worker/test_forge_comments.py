"""Status comments (apps/worker/forges/comments.py): every refusal and terminal stop posts ONE fixed sentence on the
issue or pull request when its run record is written; retried attempts post nothing; a local job's sentence
is logged; a comment that cannot be posted never fails anything and is logged by reason only."""

import logging
import re

import pytest

from apps.worker.forges import comments
from apps.worker.gates.verdicts import Verdict
from apps.worker.models import LostRetry, Outcome, Run
from apps.worker.records import record_run
from apps.worker.sandbox.exitline import RUNNER_REASONS
from tests.jobspecs import forge_spec, local_spec

pytestmark = pytest.mark.django_db

AZURE_PROJECT = "068d2409-14eb-4d8a-88bf-c8a9e7f5b4e2"
AZURE_REPOSITORY = "3411ebc1-d5aa-464f-9615-0b527bc66719"
GITHUB_COMMENTS = "/repos/acme/web/issues/7/comments"


def record(spec, verdict, attempt=1):
    return record_run(spec, verdict, attempt=attempt, host="host-a", queue="pi-jobs")


@pytest.fixture
def github(forges):
    forges.github_repository("acme/web", "a" * 40)
    return forges


# --- when a sentence is posted ---------------------------------------------------------------------------------

def test_a_pre_spend_refusal_posts_its_sentence_once(github):
    record(forge_spec("gh-c1"), Verdict.refused("unprotected-branch"))

    assert github.posted(GITHUB_COMMENTS) == [
        {"body": "Refused: the default branch is not protected. See SECURITY.md."}]
    assert github.requests[-1]["headers"]["authorization"] == "Bearer ghp-test"


def test_a_stop_after_spend_posts_the_terminal_sentence(github):
    record(forge_spec("gh-c2"), Verdict.refused("worker-abort", exit_code=137, budget_reserved=True))

    (posted,) = github.posted(GITHUB_COMMENTS)
    assert posted["body"].startswith("Stopped: the worker ended this run before it finished")


def test_operator_cancel_says_whether_anything_was_spent(github):
    record(forge_spec("gh-c3"), Verdict.refused("operator-cancel"))
    record(forge_spec("gh-c4"), Verdict.refused("operator-cancel", exit_code=143, budget_reserved=True))

    before, after = [body["body"] for body in github.posted(GITHUB_COMMENTS)]
    assert "before it started. Nothing was spent." in before
    assert after == "Stopped: the operator cancelled this run. Partial work may exist. Not retried."


def test_a_retried_attempt_posts_nothing_and_the_final_failure_posts_once(github, settings):
    assert settings.PI_RETRY_ATTEMPTS == 2
    spec = forge_spec("gh-c5")

    record(spec, Verdict.infrastructure_fault("forge-unavailable"), attempt=1)
    assert github.posted() == []

    record(spec, Verdict.infrastructure_fault("forge-unavailable"), attempt=2)
    assert github.posted(GITHUB_COMMENTS) == [{"body": comments.FAILED_DEFAULT}]


def test_a_lost_worker_is_final_at_the_first_attempt(github):
    record(forge_spec("gh-c6"), Verdict(outcome=Outcome.FAILED, reason="worker-lost"), attempt=1)
    (posted,) = github.posted(GITHUB_COMMENTS)
    assert posted["body"].startswith("Failed: the worker running this job stopped unexpectedly.")


def test_a_lost_attempt_run_again_posts_nothing_and_leaves_its_retry_every_infrastructure_retry(github, settings):
    assert settings.PI_RETRY_ATTEMPTS == 2
    spec = forge_spec("gh-c8")

    record(spec, Verdict(outcome=Outcome.FAILED, reason="worker-lost", lost_retry=LostRetry.RETRIED), attempt=1)
    record(spec, Verdict.infrastructure_fault("forge-unavailable"), attempt=2)  # its first fault: retried
    assert github.posted() == []

    record(spec, Verdict.infrastructure_fault("forge-unavailable"), attempt=3)
    assert github.posted(GITHUB_COMMENTS) == [{"body": comments.FAILED_DEFAULT}]


def test_a_lost_attempt_not_run_again_posts_why_once(github):
    record(forge_spec("gh-c9"), Verdict(outcome=Outcome.FAILED, reason="worker-lost", lost_retry=LostRetry.USED_UP),
           attempt=2)
    (posted,) = github.posted(GITHUB_COMMENTS)
    assert posted["body"].startswith("Failed: the worker running this job stopped unexpectedly.")


def test_a_completed_run_posts_nothing(github):
    record(forge_spec("gh-c7"), Verdict(outcome=Outcome.COMPLETED, exit_code=0, budget_reserved=True))
    assert github.posted() == []


# --- where it is posted, per forge -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec, path, body_key", [
    (forge_spec("gl-i", kind="gitlab", repo="group/proj", project_id="42"),
     "/api/v4/projects/42/issues/7/notes", "body"),
    (forge_spec("gl-mr", kind="gitlab", repo="group/proj", project_id="42", target_type="pull_request"),
     "/api/v4/projects/42/merge_requests/7/notes", "body"),
    (forge_spec("fj-pr", kind="forgejo", repo="kostekIV/test", target_type="pull_request"),
     "/api/v1/repos/kostekIV/test/issues/7/comments", "body"),
    (forge_spec("az-wi", kind="azure", repo="Fabrikam/widgets", project_id=AZURE_PROJECT,
                repository_id=AZURE_REPOSITORY),
     f"/{AZURE_PROJECT}/_apis/wit/workItems/7/comments", "text"),
    (forge_spec("az-pr", kind="azure", repo="Fabrikam/widgets", project_id=AZURE_PROJECT,
                repository_id=AZURE_REPOSITORY, target_type="pull_request"),
     f"/{AZURE_PROJECT}/_apis/git/repositories/{AZURE_REPOSITORY}/pullRequests/7/threads", None),
])
def test_each_forge_gets_the_sentence_on_its_issue_or_pull_request(forges, spec, path, body_key):
    forges.gitlab_project(42, "group/proj", "a" * 40)
    forges.forgejo_repository("kostekIV/test", "a" * 40)
    forges.azure_repository(AZURE_PROJECT, AZURE_REPOSITORY, "widgets", "a" * 40)

    record(spec, Verdict.refused("sha-gone"))

    (posted,) = forges.posted(path)
    text = comments.REFUSED["sha-gone"]
    if body_key:
        assert posted == {body_key: text}
    else:
        assert posted == {"comments": [{"parentCommentId": 0, "content": text, "commentType": 1}], "status": "active"}


def test_a_local_job_logs_its_sentence_instead(forges, caplog):
    caplog.set_level(logging.INFO, logger="pidispatch.comments")
    record(local_spec("run-c1", "/srv/checkouts/site"), Verdict.refused("workspace-dirty"))

    assert forges.requests == []
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("comment ")]
    assert line.startswith("comment job=run-c1 reason=workspace-dirty text=")
    assert comments.REFUSED["workspace-dirty"] in line and "/srv" not in line


# --- posting never fails anything ------------------------------------------------------------------------------

@pytest.mark.parametrize("answer, why", [((500, {}), "forge-unavailable"), ((401, {}), "forge-auth-refused"),
                                         ((403, {}, {"X-RateLimit-Remaining": "0"}), "forge-rate-limited")])
def test_a_comment_that_cannot_be_posted_is_logged_by_reason_only(github, caplog, answer, why):
    caplog.set_level(logging.INFO, logger="pidispatch.comments")
    github.routes[("POST", GITHUB_COMMENTS)] = answer
    spec = forge_spec("gh-c8", body="Secret issue text from someone@example.com")

    run = record(spec, Verdict.refused("scope-cap"))

    assert Run.objects.get(pk=run.pk).reason == "scope-cap"  # the record stands
    assert len(github.posted(GITHUB_COMMENTS)) == 1  # tried once, not retried in a loop
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"comment_failed job=gh-c8 reason=scope-cap why={why}" in logged
    assert "ghp-test" not in logged and "example.com" not in logged and "Refused:" not in logged


def test_an_unreachable_forge_or_no_credential_never_raises(forges, settings, caplog):
    caplog.set_level(logging.INFO, logger="pidispatch.comments")
    settings.GITHUB_API_URL = "http://127.0.0.1:1"
    record(forge_spec("gh-c9"), Verdict.refused("over-budget", budget_reserved=True))
    settings.GITHUB_TOKEN = ""
    record(forge_spec("gh-c10"), Verdict.refused("over-budget", budget_reserved=True))

    logged = [r.getMessage() for r in caplog.records]
    assert "comment_failed job=gh-c9 reason=over-budget why=forge-unreachable" in logged
    assert "comment_failed job=gh-c10 reason=over-budget why=forge-unconfigured" in logged


def test_a_job_without_an_issue_number_skips_the_comment(github, caplog):
    caplog.set_level(logging.INFO, logger="pidispatch.comments")
    record(forge_spec("gh-c11", number=None), Verdict.refused("daily-token-cap"))
    assert github.posted() == []
    assert "comment_skipped job=gh-c11 reason=daily-token-cap why=no-target" in [r.getMessage() for r in caplog.records]


# --- the sentences themselves ----------------------------------------------------------------------------------

ALL_SENTENCES = [*comments.REFUSED.values(), *comments.STOPPED.values(), *comments.FAILED.values(),
                 comments.FAILED_DEFAULT]


@pytest.mark.parametrize("text", ALL_SENTENCES)
def test_sentences_carry_no_path_amount_secret_reference_or_login(text):
    assert re.match(r"^(Refused|Stopped|Failed): ", text)
    assert not re.search(r"(^|[\s(])(/|~/)", text)  # no host path
    assert not re.search(r"[$€£]|\d+(\.\d+)?\s*(usd|dollars|tokens|mib|gib|bytes)", text, re.I)  # no amount
    assert not re.search(r"\d", text.replace("30-minute", ""))  # no number except the fixed job limit
    assert "@" not in text and "${" not in text and "secret" not in text.lower()


def test_every_reason_the_runner_names_has_its_own_sentence():
    # The gates' refusals are held to their sentences by tests/worker/test_gate_table.py, from ladder.GATES.
    assert RUNNER_REASONS | {"worker-abort", "runner-policy", "oom-killed", "operator-cancel",
                             "workspace-too-large"} <= set(comments.STOPPED)
    assert {"worker-lost", "secret-resolver-unreachable", "disk-full"} <= set(comments.FAILED)


def test_an_unlisted_reason_still_gets_one_fixed_sentence_naming_only_its_token():
    run = Run(outcome=Outcome.POLICY, reason="brand-new-gate", attempt=1)
    assert comments.sentence_for(run) == "Refused: this job was refused before it started (brand-new-gate). Not run."
