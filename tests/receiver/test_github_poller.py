"""The GitHub poller (`manage.py poll_github`), against the stand-in GitHub's REST feeds: new issue events, comments
and pull requests become jobs through the same intake as webhooks (`gh-poll-...` job ids); a repository's first
poll starts nothing; a restart resumes from the cursors in the database; a delivery both a webhook and the poller
saw runs once; unchanged feeds answer 304 and cost nothing of the rate budget; a bad repository is a clear error."""

import os
import signal
import subprocess
import sys

import pytest
from rq import Queue

from apps.receiver.models import Delivery, PollCursor, Trigger
from tests.conftest import ROOT, SELF_ID, WEBHOOK_SECRET, database_url, github_payload, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REPO = "acme/web"
MIA = {"login": "maintainer-mia", "id": 4410987}
ALEX = {"login": "alex-dev", "id": 5520001}
TOKEN = "ghp-poller-token"


@pytest.fixture
def github(fake_forge):
    feeds = fake_forge.github_issue_feeds(REPO)
    fake_forge.github_permission(REPO, ALEX["login"], "write")
    return feeds


def poller_env(fake_forge, **extra) -> dict:
    return {**os.environ, "DATABASE_URL": database_url(), "GITHUB_API_URL": fake_forge.url, "GITHUB_TOKEN": TOKEN,
            "GITHUB_SELF_ID": SELF_ID, "GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET, "POLL_REPOS": REPO,
            "DATABASE_CONN_MAX_AGE": "0", **{name: str(value) for name, value in extra.items()}}


def poll_once(fake_forge, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "poll_github", "--once"], cwd=ROOT,
                          env=poller_env(fake_forge, **extra), capture_output=True, text=True, timeout=60)


def queued(redis_conn) -> list[str]:
    return sorted(Queue("pi-jobs", connection=redis_conn).get_job_ids())


@pytest.fixture
def rules(label_trigger):
    Trigger.objects.create(position=1, kind="github", on_type="comment", phrase="@pi", flow="fix-bug")
    Trigger.objects.create(position=2, kind="github", on_type="pull_request", actions=["opened", "synchronize"],
                           flow="review")


def test_new_events_comments_and_pull_requests_become_jobs_and_a_restart_resumes_from_the_cursors(
        github, fake_forge, rules, redis_conn, admin_client):
    github.open_issue(7, labels=["pi"])
    github.label(7, "pi", MIA)  # before the first poll: not news
    github.comment(7, "@pi please", ALEX)

    armed = poll_once(fake_forge, PI_DEDUP_WINDOW_SECONDS=0)

    assert armed.returncode == 0, armed.stderr
    assert queued(redis_conn) == [] and PollCursor.objects.get(repo=REPO).armed_at is not None
    github.open_issue(8)
    labelled = github.label(8, "pi", MIA)
    github.open_issue(9)
    commented = github.comment(9, "@pi have a look", ALEX)
    fake_forge.add_pull_request("github", REPO, head="feature", sha="a1b2c3d4e5f6" + "0" * 28, number=41, author=ALEX)

    first = poll_once(fake_forge, PI_DEDUP_WINDOW_SECONDS=0)

    assert first.returncode == 0, first.stderr
    expected = [f"gh-poll-c{commented['id']}", f"gh-poll-e{labelled['id']}", "gh-poll-pr41-a1b2c3d"]
    assert queued(redis_conn) == expected
    assert "3 queued" in first.stdout
    # A restart (every --once is a new process) reads on from the cursors: only what came since.
    github.edit_comment(commented, "@pi have another look")  # an edit is not a new comment
    github.push(41, "f00dfeed" + "1" * 32)
    github.open_issue(10)
    again = github.label(10, "pi", MIA)
    github.open_issue(11)
    github.comment(11, "@pi look", ALEX)
    del github.issues[11]  # deleted since: its comment is skipped, and the feed goes on
    closed = github.close(7, MIA)  # no close rule: the intake ignores it

    second = poll_once(fake_forge, PI_DEDUP_WINDOW_SECONDS=0)

    assert second.returncode == 0, second.stderr
    assert queued(redis_conn) == sorted([*expected, f"gh-poll-e{again['id']}", "gh-poll-pr41-f00dfee"])
    assert poll_once(fake_forge, PI_DEDUP_WINDOW_SECONDS=0).returncode == 0
    assert len(queued(redis_conn)) == 5
    # The inbox has each delivery once, under its own id, and no issue text once settled.
    assert Delivery.objects.filter(delivery_id__startswith="poll-").count() == 6
    assert Delivery.objects.get(delivery_id=f"poll-e{closed['id']}").status == "ignored"
    for delivery in Delivery.objects.filter(delivery_id__startswith="poll-"):
        assert not delivery.payload
    cursors = admin_client.get("/admin/receiver/pollcursor/").content.decode()
    assert REPO in cursors and "<td class=\"field-open_pulls\">1</td>" in cursors
    for output in (armed, first, second):
        assert "have a look" not in output.stderr + output.stdout and "maintainer-mia" not in output.stderr


def test_a_delivery_both_a_webhook_and_the_poller_saw_runs_once(github, fake_forge, label_trigger, redis_conn,
                                                                post_github):
    github.open_issue(7)
    github.open_issue(8)
    assert poll_once(fake_forge).returncode == 0
    # The webhook first, then the poller's sight of the same label.
    webhook = post_github(github_payload(labels=("pi",)), delivery="guid-7")
    assert webhook.status_code == 202 and webhook.json()["status"] == "queued"
    github.label(7, "pi", MIA)

    polled = poll_once(fake_forge)

    assert polled.returncode == 0, polled.stderr
    assert "1 duplicate(s)" in polled.stdout and queued(redis_conn) == ["gh-guid-7"]
    # The poller first, then the webhook.
    labelled = github.label(8, "pi", MIA)
    assert poll_once(fake_forge).returncode == 0
    body = github_payload(labels=("pi",)).replace(b'"number": 7', b'"number": 8')
    late = post_github(body, delivery="guid-8")
    assert late.status_code == 202 and late.json()["status"] == "duplicate"
    assert queued(redis_conn) == sorted(["gh-guid-7", f"gh-poll-e{labelled['id']}"])


def test_unchanged_feeds_answer_304_and_cost_nothing_of_the_rate_budget(github, fake_forge, label_trigger,
                                                                         redis_conn):
    github.open_issue(7)
    assert poll_once(fake_forge).returncode == 0  # arms: one full read of each feed
    spent = fake_forge.rate_limit - fake_forge.rate_remaining
    assert spent == 3

    quiet = poll_once(fake_forge)

    assert quiet.returncode == 0, quiet.stderr
    assert "3 unchanged feed(s)" in quiet.stdout and fake_forge.not_modified == 3
    assert fake_forge.rate_limit - fake_forge.rate_remaining == spent  # 304s are free
    assert all(request["headers"].get("if-none-match") for request in fake_forge.requests[-3:])
    # A change costs what it reads, and no more.
    github.label(7, "pi", MIA)
    assert poll_once(fake_forge).returncode == 0
    assert len(queued(redis_conn)) == 1
    assert fake_forge.rate_limit - fake_forge.rate_remaining == spent + 1 and fake_forge.not_modified == 5


def test_a_bad_repository_name_is_a_clear_error(github, fake_forge, label_trigger):
    malformed = poll_once(fake_forge, POLL_REPOS="acme/web,acme")

    assert malformed.returncode == 2
    assert "POLL_REPOS: 'acme' is not a GitHub repository name: write owner/name" in malformed.stderr
    assert not any(request["path"].startswith("/repos/") for request in fake_forge.requests)

    unknown = poll_once(fake_forge, POLL_REPOS="acme/web,acme/nope")

    assert unknown.returncode == 1
    assert "github:acme/nope: GitHub answers 404" in unknown.stderr and "check POLL_REPOS" in unknown.stderr
    assert PollCursor.objects.get(repo=REPO).armed_at is not None  # the others are polled all the same
    assert TOKEN not in unknown.stderr + unknown.stdout


def test_the_poller_runs_until_sigterm_and_stops_cleanly(github, fake_forge, label_trigger, tmp_path):
    with open(tmp_path / "poller.log", "w") as log:
        process = subprocess.Popen([sys.executable, "manage.py", "poll_github"], cwd=ROOT, stdout=log,
                                   stderr=subprocess.STDOUT, env=poller_env(fake_forge, POLL_INTERVAL_SECONDS=5))
        try:
            wait_for(lambda: "poll_cycle repos=1" in (tmp_path / "poller.log").read_text(), timeout=30,
                     what="the first cycle")
            assert "every 30 s" in (tmp_path / "poller.log").read_text()  # the floor
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0
        finally:
            if process.poll() is None:
                process.kill()
    assert "poller stopped" in (tmp_path / "poller.log").read_text()


def test_a_spent_rate_budget_ends_the_poll_until_it_is_back_and_loses_nothing(github, fake_forge, label_trigger,
                                                                               redis_conn):
    github.open_issue(7)
    assert poll_once(fake_forge).returncode == 0
    labelled = github.label(7, "pi", MIA)
    fake_forge.rate_remaining = 0

    limited = poll_once(fake_forge)

    assert limited.returncode == 1 and "rate limit ended the poll early" in limited.stderr
    assert "poll_rate_limited repo=acme/web" in limited.stderr and queued(redis_conn) == []
    fake_forge.rate_remaining = 100
    assert poll_once(fake_forge).returncode == 0
    assert queued(redis_conn) == [f"gh-poll-e{labelled['id']}"]


def test_without_poll_repos_it_polls_the_github_app_installations_repositories_with_read_only_tokens(
        github, fake_forge, label_trigger, redis_conn):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    fake_forge.github_app("4242", "99", key.public_key(), account="acme", token="ghs_poll")
    fake_forge.routes["/installation/repositories"] = (200, {"total_count": 1, "repositories": [
        {"id": 1, "full_name": REPO}]})
    app = {"POLL_REPOS": "", "GITHUB_TOKEN": "", "GITHUB_APP_ID": "4242", "GITHUB_APP_INSTALLATION_ID": "99",
           "GITHUB_APP_PRIVATE_KEY": pem}
    github.open_issue(7)
    assert poll_once(fake_forge, **app).returncode == 0
    labelled = github.label(7, "pi", MIA)

    polled = poll_once(fake_forge, **app)

    assert polled.returncode == 0, polled.stderr
    assert queued(redis_conn) == [f"gh-poll-e{labelled['id']}"]
    assert fake_forge.minted and all(set(minted["permissions"].values()) == {"read"} for minted in fake_forge.minted)
    feeds = [request for request in fake_forge.requests if request["path"].startswith(f"/repos/{REPO}/issues")]
    assert feeds and all(request["headers"]["authorization"].startswith("Bearer ghs_poll-") for request in feeds)
