"""`manage.py send_delivery`: a sample delivery of each forge, signed with the deployment's own secret, posted to a
live server whose forges are `make run`'s stand-in (devtools/fake_forge.py `forges_for_any_repository`, which must
answer each forge's access lookup), and what became of it, as the person trying it out reads it."""

import base64
import io
import re

import pytest
from django.core.management import CommandError, call_command

from apps.receiver.sample_deliveries import SAMPLES, build, job_state
from devtools.fake_forge import forges_for_any_repository
from tests.receiver_support import queued, rule

TOKENS = {"github": "gh-demo", "gitlab": "gl-demo", "forgejo": "fj-demo", "azure": "az-demo"}
PREFIXES = {"github": "gh", "gitlab": "gl", "forgejo": "fj", "azure": "az"}


@pytest.fixture
def stand_in(settings, tmp_path):
    from apps.worker.forges.base import ForgeClient

    ForgeClient.authority_cache.clear()
    server = forges_for_any_repository(tmp_path / "forge", TOKENS, {"README.md": "hello\n"})
    settings.GITHUB_API_URL, settings.GITHUB_TOKEN = server.url, TOKENS["github"]
    settings.GITLAB_WEBHOOK_MODE, settings.GITLAB_WEBHOOK_SECRET = "token", "gitlab-secret"
    settings.GITLAB_URL, settings.GITLAB_TOKEN, settings.GITLAB_SELF_ID = server.url, TOKENS["gitlab"], "1"
    settings.FORGEJO_WEBHOOK_SECRET, settings.FORGEJO_URL = "forgejo-secret", server.url
    settings.FORGEJO_TOKEN, settings.FORGEJO_SELF_ID = TOKENS["forgejo"], "1"
    settings.AZURE_WEBHOOK_MODE, settings.AZURE_WEBHOOK_SECRET = "basic", "pidispatch:azure-secret"
    settings.AZURE_ORG_URL, settings.AZURE_TOKEN = server.url, TOKENS["azure"]
    settings.AZURE_SELF_ID = "0f0f0f0f-1111-2222-3333-444444444444"
    settings.PI_PUBLIC_URL = ""
    yield server
    server.close()
    ForgeClient.authority_cache.clear()


def send(**options) -> str:
    out = io.StringIO()
    call_command("send_delivery", stdout=out, **{"wait": 0, **options})  # no worker here to follow
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("forge", ["github", "gitlab", "forgejo", "azure"])
def test_a_labelled_issue_of_each_forge_is_queued(forge, stand_in, live_server, redis_conn):
    rule(position=0, kind=forge, on_type="label", label_any=["pi"], flow="demo",
         repository="web" if forge == "azure" else "")

    printed = send(forge=forge, label="pi", number=77, url=live_server.url)

    assert f"to {live_server.url}/hooks/{forge}: HTTP 202" in printed, printed
    job_id = re.search(rf"^queued: ({PREFIXES[forge]}-sample-[0-9a-f-]+)$", printed, re.MULTILINE).group(1)
    assert queued(redis_conn) == [job_id]
    assert job_state(job_id, live_server.url) == (f"{job_id}: queued (no worker has taken it yet: is one running?)",
                                                  False)
    if forge != "github":  # GitHub's `labeled` is approval in itself; the others asked the stand-in
        assert any(path.endswith(("/members/all/1201", "/permission")) or "/_apis/graph/memberships/" in path
                   for path in stand_in.paths()), stand_in.paths()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("forge, event, action", [("gitlab", "merge_request", "update"),
                                                  ("forgejo", "pull_request", "label_updated"),
                                                  ("github", "pull_request", "labeled")])
def test_a_labelled_pull_request_names_its_job(forge, event, action, stand_in, live_server, redis_conn):
    rule(position=0, kind=forge, on_type="pull_request", actions=[action], label_any=["pi"], flow="review")

    printed = send(forge=forge, event=event, label="pi", url=live_server.url)

    job_id = re.search(r"^queued: (\S+)$", printed, re.MULTILINE).group(1)
    assert queued(redis_conn) == [job_id]


@pytest.mark.django_db(transaction=True)
def test_what_no_rule_wants_is_ignored_with_its_reason(stand_in, live_server, redis_conn):
    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="demo")

    printed = send(forge="gitlab", label="wontfix", url=live_server.url)

    assert re.search(r"^ignored: [a-z-]+$", printed, re.MULTILINE), printed
    assert queued(redis_conn) == []


@pytest.mark.django_db(transaction=True)
def test_a_server_with_another_secret_refuses_it_and_says_why(stand_in, live_server, settings):
    # The deployment signs with what it has; the server at the other end verifies with its own (here changed).
    from apps.receiver.sample_deliveries import post

    sample = build("forgejo", label="pi")
    settings.FORGEJO_WEBHOOK_SECRET = "rotated-secret"
    status, answer = post(sample, live_server.url)
    assert (status, answer) == (401, {"error": "invalid-signature"})


def test_bad_input_is_a_clear_error(stand_in, settings):
    with pytest.raises(CommandError, match=r"no sample of gitlab event 'push': one of issue, merge_request, note"):
        send(forge="gitlab", event="push")
    settings.AZURE_WEBHOOK_MODE = settings.AZURE_WEBHOOK_SECRET = settings.AZURE_SELF_ID = ""
    with pytest.raises(CommandError, match="azure is not configured on this deployment"):
        send(forge="azure")
    with pytest.raises(CommandError, match=r"could not reach the server at http://127\.0\.0\.1:9"):
        send(forge="github", url="http://127.0.0.1:9")


def test_azure_is_authenticated_as_its_subscription_says(stand_in):
    sample = build("azure", label="pi")
    assert sample.headers == {"Authorization": "Basic " + base64.b64encode(b"pidispatch:azure-secret").decode()}


@pytest.mark.parametrize("common, forge, event", [
    ("issue", "github", "issues"), ("issue", "gitlab", "issue"), ("issue", "forgejo", "issues"),
    ("issue", "azure", "workitem.updated"), ("pull_request", "gitlab", "merge_request"),
    ("merge_request", "github", "pull_request"), ("pull_request", "azure", "git.pullrequest.created"),
    ("comment", "gitlab", "note"), ("comment", "azure", "workitem.commented")])
def test_the_common_event_names_work_on_every_forge(common, forge, event, stand_in):
    assert build(forge, common, label="pi").event == event


@pytest.mark.django_db
@pytest.mark.parametrize("forge, event", sorted(SAMPLES))
def test_every_sample_is_an_event_the_matcher_acts_on(forge, event, stand_in, client):
    """With no trigger at all, each sample is verified, read and considered: ignored for want of a rule, never
    refused (401/400) nor dropped as an event or action nobody handles."""
    sample = build(forge, event, label="pi", comment="@pi please")
    response = client.post(f"/hooks/{forge}", data=sample.body, content_type="application/json",
                           headers=sample.headers)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["status"] == "ignored", answer
    assert answer["reason"] not in ("unhandled-event", "action-not-actionable", "no-label-change"), answer
