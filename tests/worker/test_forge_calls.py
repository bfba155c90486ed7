"""Forge calls that respect the forge (apps/worker/forges/base.py), over real HTTP against the stand-in forge: the wait
a rate limit or an outage asks for (`Retry-After`, the rate-limit reset headers) is the failure's, and a retried job
or a delivery waiting in the inbox on a lookup waits at least that long; one connection carries a client's pages and
steps; a refusal keeps the forge's own words for the run record (scrubbed, bounded) and nowhere else."""

import time
from datetime import timedelta
from email.utils import formatdate

import pytest
from django.utils import timezone
from rq import Queue
from rq.registry import ScheduledJobRegistry

from apps.worker.forges import Credential, ForgeFailure, RepoRef, Subject
from apps.worker.forges import base as forges_base
from apps.worker.forges.azure import AzureClient
from apps.worker.forges.forgejo import ForgejoClient
from apps.worker.forges.github import GitHubClient
from apps.worker.models import Outcome, Run
from devtools.fake_forge import count_connections
from tests.receiver_support import (
    AZURE_PROJECT_ID,
    basic,
    deliver,
    dumps,
    github_headers,
    load,
    make_repository,
    post,
    queued,
    rule,
)

MAIN_SHA = "1" * 40
CREDENTIAL = Credential(token="forge-job-token")
PAT = "ghp-e2e-token"
FILES = {"README.md": "# web\n", ".pi/skills/fix-bug/SKILL.md": "# Fix a bug\n"}


def github_client(server, **options) -> GitHubClient:
    return GitHubClient(base_url=server.url, token="config-token", timeout=2, **options)


def failure_of(call) -> ForgeFailure:
    with pytest.raises(ForgeFailure) as raised:
        call()
    return raised.value


# --- how long the forge asked us to wait ---------------------------------------------------------------------------

# Each answer's headers, from the instant of the call (an HTTP date and the reset instants are absolute).
@pytest.mark.parametrize("status, headers, waits", [
    (429, lambda now: {"Retry-After": "120"}, 120),  # every forge: seconds
    (503, lambda now: {"Retry-After": formatdate(now + 300, usegmt=True)}, 300),  # or an HTTP date
    # GitHub: the primary rate limit spent, until its reset (epoch seconds)
    (403, lambda now: {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(now) + 200)}, 200),
    # GitLab: RateLimit-* (epoch seconds), and a reset written as seconds from now (the IETF draft)
    (429, lambda now: {"RateLimit-Remaining": "0", "RateLimit-Reset": str(int(now) + 90)}, 90),
    (429, lambda now: {"RateLimit-Remaining": "0", "RateLimit-Reset": "45"}, 45),
])
def test_the_wait_the_forge_asks_for_is_the_failures(fake_forge, status, headers, waits):
    fake_forge.routes["/repos/acme/web"] = (status, {"message": "slow down"}, headers(time.time()))

    failure = failure_of(lambda: github_client(fake_forge).default_branch(RepoRef("acme/web"), CREDENTIAL))

    assert failure.transient and failure.reason in ("forge-rate-limited", "forge-unavailable")
    assert waits - 2 <= failure.retry_after <= waits


def test_the_wait_is_bounded_and_absent_when_the_forge_does_not_say(fake_forge, settings):
    settings.PI_FORGE_RETRY_AFTER_MAX_SECONDS = 600
    client = github_client(fake_forge)
    fake_forge.routes["/repos/acme/web"] = (429, {}, {"Retry-After": "86400"})
    assert failure_of(lambda: client.default_branch(RepoRef("acme/web"), CREDENTIAL)).retry_after == 600

    fake_forge.routes["/repos/acme/web"] = (502, {})
    assert failure_of(lambda: client.default_branch(RepoRef("acme/web"), CREDENTIAL)).retry_after is None


@pytest.mark.django_db
def test_a_delivery_whose_lookup_the_forge_rate_limits_waits_in_the_inbox_as_long_as_it_asked(
        client, forges, redis_conn):
    from apps.receiver.models import Delivery, DeliveryStatus

    rule(position=0, kind="github", on_type="comment", phrase="@pi", flow="triage")
    forges.routes["/repos/acme/web/collaborators/maintainer-mia/permission"] = (
        429, {"message": "secondary rate limit"}, {"Retry-After": "900"})
    payload = load("github/issue_comment_created.json")
    payload["comment"]["body"] = "@pi please take this one"
    body = dumps(payload)
    asked = timezone.now()

    assert post(client, "github", body, github_headers(body, "issue_comment", "d-wait")).json() == {
        "status": "accepted"}

    delivery = Delivery.objects.get(delivery_id="d-wait")
    assert (delivery.status, delivery.reason) == (DeliveryStatus.PENDING, "permission-lookup-failed")
    assert delivery.next_attempt_at >= asked + timedelta(seconds=900)  # not the inbox's own first backoff
    assert queued(redis_conn) == []


# --- one connection per client ----------------------------------------------------------------------------------------

def test_a_forgejo_listing_reads_every_page_over_one_connection(fake_forge):
    fake_forge.forgejo_repository("kostekIV/test", MAIN_SHA)
    mine = fake_forge.add_pull_request("forgejo", "kostekIV/test", head="pi/issue-7", sha=MAIN_SHA)
    for number in range(120):
        fake_forge.add_pull_request("forgejo", "kostekIV/test", head=f"other-{number}", sha=MAIN_SHA)
    connections = count_connections(fake_forge)
    client = ForgejoClient(base_url=fake_forge.url, token="config-token", timeout=2)

    found = client.find_pull_request(RepoRef("kostekIV/test"), "pi/issue-7", "main", CREDENTIAL)

    assert found is not None and found.number == mine["number"]
    pages = [r for r in fake_forge.requests if r["path"].endswith("/pulls")]
    assert len(pages) == 3 and len(connections) == 1


def test_an_azure_membership_walk_takes_every_step_over_one_connection(fake_forge):
    actor = "9a8b7c6d-1111-2222-3333-444455556666"
    descriptors = fake_forge.azure_member(actor, group="Contributors")
    # The actor is in a team, the team in Contributors: one more step up.
    fake_forge.routes["/_apis/graph/memberships/aad.9a8b7c6d"] = (200, {"value": [
        {"containerDescriptor": "vssgp.team", "memberDescriptor": "aad.9a8b7c6d"}]})
    fake_forge.routes["/_apis/graph/memberships/vssgp.team"] = (200, {"value": [
        {"containerDescriptor": descriptors["Contributors"], "memberDescriptor": "vssgp.team"}]})
    connections = count_connections(fake_forge)
    client = AzureClient(base_url=fake_forge.url, token="config-token", graph_url=fake_forge.url, timeout=2)

    allowed = client.authority(Subject(project_id=AZURE_PROJECT_ID, actor_id=actor))

    assert allowed.allowed is True
    assert len([r for r in fake_forge.requests if "/_apis/graph/" in r["path"]]) == 5
    assert len(connections) == 1


def test_the_next_client_of_the_same_forge_reuses_the_connection_and_refusals_keep_it(fake_forge):
    fake_forge.github_repository("acme/web", MAIN_SHA)
    connections = count_connections(fake_forge)

    github_client(fake_forge).default_branch(RepoRef("acme/web"), CREDENTIAL)  # the repository, its branch
    fake_forge.routes["/repos/acme/web/pulls/9"] = (404, {"message": "Not Found"})
    failure_of(lambda: github_client(fake_forge).pull_head(RepoRef("acme/web"), 9, CREDENTIAL))
    github_client(fake_forge).default_branch(RepoRef("acme/web"), CREDENTIAL)

    assert len(fake_forge.requests) == 5 and len(connections) == 1


def test_bodies_stay_bounded_and_redirects_refused_on_a_reused_connection(fake_forge, monkeypatch):
    fake_forge.github_repository("acme/web", MAIN_SHA)
    client = github_client(fake_forge)
    connections = count_connections(fake_forge)
    monkeypatch.setattr(forges_base, "MAX_RESPONSE_BYTES", 1024)
    fake_forge.routes["/repos/acme/web/pulls/3"] = (200, {"number": 3, "padding": "x" * 100_000})

    # Cut at the bound, the answer is no JSON: never read whole, and the connection is closed rather than drained.
    assert failure_of(lambda: client.pull_head(RepoRef("acme/web"), 3, CREDENTIAL)).reason == "forge-malformed-answer"
    fake_forge.routes["/repos/acme/web/pulls/4"] = (302, {}, {"Location": "http://example.com/"})
    assert failure_of(lambda: client.pull_head(RepoRef("acme/web"), 4, CREDENTIAL)).reason == "forge-redirect-refused"
    assert [r["path"] for r in fake_forge.requests] == ["/repos/acme/web/pulls/3", "/repos/acme/web/pulls/4"]
    assert len(connections) == 2  # the cut answer's connection was not reused


# --- the forge's own words ----------------------------------------------------------------------------------------

def test_a_refusal_keeps_the_forges_message_bounded_and_without_tokens(fake_forge):
    fake_forge.routes[("POST", "/repos/acme/web/pulls")] = (422, {"message": "Validation Failed", "errors": [
        {"resource": "PullRequest", "code": "custom", "message": "Base branch was modified. Review and try again."},
        {"message": "your token ghp_0123456789abcdefghijklmnopqrstuvwxyz was used " + "very " * 200}]})

    failure = failure_of(lambda: github_client(fake_forge).open_pull_request(
        RepoRef("acme/web"), head_branch="pi/issue-7", base_branch="main", title="Fix", body="", draft=False,
        issue_number=7, credential=CREDENTIAL))

    assert (failure.reason, failure.transient) == ("forge-request-refused", False)
    assert failure.forge_message.startswith("Validation Failed Base branch was modified. Review and try again.")
    assert "ghp_0123456789" not in failure.forge_message and "[scrubbed]" in failure.forge_message
    assert len(failure.forge_message) <= forges_base.MAX_FORGE_MESSAGE_CHARS
    assert "Validation" not in str(failure)  # what is logged of a failure is its reason alone


# --- through a real worker ------------------------------------------------------------------------------------------

@pytest.fixture
def github(fake_forge, tmp_path):
    """`acme/web` on a local GitHub: protected `main`, cloned over smart HTTP with the PAT."""
    root = tmp_path / "remote"
    fake_forge.sha = make_repository(root, "acme/web", FILES)
    fake_forge.serve_git(root, basic("x-access-token", PAT))
    fake_forge.github_repository("acme/web", fake_forge.sha)
    fake_forge.env = {"GITHUB_API_URL": fake_forge.url, "GITHUB_TOKEN": PAT}
    return fake_forge


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_a_job_the_forge_rate_limits_is_retried_no_sooner_than_the_forge_asked(
        github, post_github, label_trigger, run_worker, redis_conn):
    github.routes["/repos/acme/web"] = (429, {"message": "API rate limit exceeded"}, {"Retry-After": "300"})
    job_id = deliver(post_github, "fc-rate-limited")
    started = time.time()

    run_worker("pi-jobs", env_overrides=github.env)  # PI_RETRY_BACKOFF_SECONDS is 1 in the tests

    first = Run.objects.get(job_id=job_id, attempt=1)
    assert (first.outcome, first.reason) == (Outcome.FAILED, "forge-rate-limited")
    queue = Queue("pi-jobs", connection=redis_conn)
    assert queue.fetch_job(job_id).get_status() == "scheduled"
    retry_at = ScheduledJobRegistry(queue=queue).get_scheduled_time(job_id).timestamp()
    assert retry_at >= int(started) + 300  # RQ keeps the time to the whole second, cut down
    assert not Run.objects.filter(job_id=job_id, attempt=2).exists()


@pytest.mark.docker
@pytest.mark.django_db(transaction=True)
def test_a_refused_request_keeps_the_forges_message_on_the_run_page_and_out_of_the_log(
        github, post_github, label_trigger, run_worker, admin_client, client):
    from django.contrib.auth.models import User

    from apps.access import tokens

    said = f"Repository access blocked: the token {PAT} may not read this repository"
    github.routes["/repos/acme/web"] = (451, {"message": said})
    job_id = deliver(post_github, "fc-refused")

    result = run_worker("pi-jobs", env_overrides=github.env)

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.POLICY, "forge-request-refused")
    assert run.forge_message == "Repository access blocked: the token [scrubbed] may not read this repository"
    page = admin_client.get(f"/admin/worker/run/{run.pk}/change/").content.decode()
    assert "Repository access blocked: the token [scrubbed] may not read this repository" in page
    assert "access blocked" not in result.stdout + result.stderr
    _, token = tokens.issue(User.objects.create_superuser("reader", password="unused"), name="t", scope="read")
    listed = client.get(f"/api/v1/runs?job_id={job_id}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert listed.json()["results"][0]["reason"] == "forge-request-refused"
    assert "access blocked" not in listed.content.decode()  # the run page's, not the API's
