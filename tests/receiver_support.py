"""Shared by the receiver and forge-client tests: deliveries signed exactly as each forge signs them, and a
small local HTTP server standing in for the forges' APIs (their SaaS cannot run here).

Import the fixtures you use: `from tests.receiver_support import fake_forge, forges  # noqa: F401`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from pathlib import Path

import pytest

PAYLOADS = Path(__file__).resolve().parent / "payloads"
# A copy of ../shared/corpus (Zulip fixtures, Apache-2.0).
CORPUS = Path(__file__).resolve().parent / "payloads" / "corpus"

GITHUB_SECRET = "test-webhook-secret"
GITLAB_TOKEN_SECRET = "gitlab-shared-token"
GITLAB_SIGNING_KEY = base64.b64encode(b"k" * 32).decode()
GITLAB_SIGNING_SECRET = "whsec_" + GITLAB_SIGNING_KEY
FORGEJO_SECRET = "forgejo-webhook-secret"
AZURE_USER, AZURE_PASSWORD = "pidispatch", "azure-hook-password"
AZURE_HEADER, AZURE_HEADER_VALUE = "X-Pi-Hook-Key", "azure-header-secret"

SELF_IDS = {"github": "424242", "gitlab": "900001", "forgejo": "900002",
            "azure": "0f0f0f0f-1111-2222-3333-444444444444"}
from devtools.fake_forge import AZURE_FORK_PROJECT, AZURE_PROJECT_ID  # noqa: E402,F401  (re-exported)


def load(relative: str) -> dict:
    return json.loads((PAYLOADS / relative).read_text())


def dumps(payload: dict) -> bytes:
    return json.dumps(payload).encode()


# --- signing as the forges do ------------------------------------------------------------------------------

def github_signature(body: bytes, secret: str = GITHUB_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(body: bytes, event: str, delivery: str, secret: str = GITHUB_SECRET) -> dict:
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": github_signature(body, secret), "X-GitHub-Hook-ID": "4711",
            "User-Agent": "GitHub-Hookshot/abc"}


def gitlab_token_headers(event: str, delivery: str, token: str = GITLAB_TOKEN_SECRET) -> dict:
    return {"X-Gitlab-Event": event, "X-Gitlab-Token": token, "Idempotency-Key": delivery,
            "X-Gitlab-Event-UUID": str(uuid.uuid4()), "X-Gitlab-Webhook-UUID": str(uuid.uuid4()),
            "X-Gitlab-Instance": "https://gitlab.example.com", "User-Agent": "GitLab/17.6.0"}


def gitlab_signature_headers(body: bytes, event: str, delivery: str, *, key: str = GITLAB_SIGNING_KEY,
                             timestamp: int | None = None) -> dict:
    """Standard Webhooks: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {"X-Gitlab-Event": event, "webhook-id": delivery, "webhook-timestamp": str(timestamp),
            "webhook-signature": gitlab_signature(body, delivery, timestamp, key=key), "Idempotency-Key": delivery,
            "User-Agent": "GitLab/19.1.0"}


def gitlab_signature(body: bytes, delivery: str, timestamp, *, key: str = GITLAB_SIGNING_KEY) -> str:
    """One `webhook-signature` entry, signed over the timestamp exactly as it is sent."""
    signed = f"{delivery}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(base64.b64decode(key), signed, hashlib.sha256).digest()).decode()


def forgejo_headers(body: bytes, event: str, delivery: str, secret: str = FORGEJO_SECRET, *, flavour="forgejo",
                    event_type: str | None = None) -> dict:
    """Forgejo and Gitea send their own headers plus GitHub's and Gogs' names for the same values."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": f"sha256={digest}",
        "X-Gogs-Event": event, "X-Gogs-Delivery": delivery, "X-Gogs-Signature": digest,
        "X-Gitea-Event": event, "X-Gitea-Delivery": delivery, "X-Gitea-Signature": digest,
        "X-Gitea-Event-Type": event_type or event,
    }
    if flavour == "forgejo":
        headers.update({"X-Forgejo-Event": event, "X-Forgejo-Delivery": delivery, "X-Forgejo-Signature": digest,
                        "X-Forgejo-Event-Type": event_type or event})
    return headers


def azure_basic_headers(user: str = AZURE_USER, password: str = AZURE_PASSWORD) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode(),
            "User-Agent": "VSServices/16.255.0"}


def post(client, forge: str, body: bytes, headers: dict, path: str | None = None):
    return client.post(path or f"/hooks/{forge}", data=body, content_type="application/json", headers=headers)


# --- a stand-in for the forges' APIs and git remotes (devtools/fake_forge.py; the make run demo uses it too) ---

from devtools.fake_forge import (  # noqa: E402,F401  (re-exported for the tests)
    GIT_IDENTITY,
    FakeForge,
    basic,
    commit_files,
    git,
    github_for_any_repository,
    make_repository,
    prune_unreachable,
)

STAND_IN_TOKEN = "ghp-worker-test-token"


@pytest.fixture(scope="session")
def github_stand_in(tmp_path_factory):
    """One GitHub for every worker the tests start (conftest's `worker_env` points at it): every
    repository is a protected `main` holding one README, cloned from a local git remote with
    STAND_IN_TOKEN. Tests of the forge side itself use their own `fake_forge`."""
    server = github_for_any_repository(tmp_path_factory.mktemp("github-stand-in"), STAND_IN_TOKEN,
                                       {"README.md": "A repository for the tests.\n"})
    yield server
    server.close()


@pytest.fixture
def fake_forge():
    from apps.worker.forges.azure import AzureClient
    from apps.worker.forges.base import ForgeClient
    from apps.worker.forges.github_app import GitHubApp

    caches = (ForgeClient.authority_cache, AzureClient.project_groups_cache, GitHubApp.token_cache)
    for cache in caches:
        cache.clear()
    server = FakeForge()
    yield server
    server.close()
    for cache in caches:
        cache.clear()


@pytest.fixture
def forges(settings, fake_forge):
    """All four forges served, their APIs answered by `fake_forge`, their self ids configured."""
    settings.GITHUB_WEBHOOK_SECRET = GITHUB_SECRET
    settings.GITHUB_SELF_ID = SELF_IDS["github"]
    settings.GITHUB_TOKEN = "ghp-test"
    settings.GITHUB_API_URL = fake_forge.url
    settings.GITLAB_WEBHOOK_MODE = "token"
    settings.GITLAB_WEBHOOK_SECRET = GITLAB_TOKEN_SECRET
    settings.GITLAB_TOKEN = "glpat-test"
    settings.GITLAB_URL = fake_forge.url
    settings.GITLAB_SELF_ID = SELF_IDS["gitlab"]
    settings.FORGEJO_WEBHOOK_SECRET = FORGEJO_SECRET
    settings.FORGEJO_TOKEN = "forgejo-test-token"
    settings.FORGEJO_URL = fake_forge.url
    settings.FORGEJO_SELF_ID = SELF_IDS["forgejo"]
    settings.AZURE_WEBHOOK_MODE = "basic"
    settings.AZURE_WEBHOOK_SECRET = f"{AZURE_USER}:{AZURE_PASSWORD}"
    settings.AZURE_ORG_URL = fake_forge.url
    settings.AZURE_GRAPH_URL = fake_forge.url
    settings.AZURE_TOKEN = "azure-pat"
    settings.AZURE_SELF_ID = SELF_IDS["azure"]
    settings.AZURE_FORK_PROJECT = AZURE_FORK_PROJECT
    settings.PI_FORGE_API_TIMEOUT_SECONDS = 2.0
    return fake_forge


def rule(**fields):
    """A Trigger row, validated like the admin validates it."""
    from apps.receiver.models import Trigger

    trigger = Trigger(**fields)
    trigger.full_clean()
    trigger.save()
    return trigger


def queued(redis_conn, queue: str = "pi-jobs") -> list[str]:
    from rq import Queue

    return Queue(queue, connection=redis_conn).get_job_ids()


def job_spec(redis_conn, job_id: str, queue: str = "pi-jobs") -> dict:
    from rq import Queue

    job = Queue(queue, connection=redis_conn).fetch_job(job_id)
    assert job is not None, f"no job {job_id} in {queue}"
    return job.args[0]


def deliver(post_github, delivery: str, body_text: str = "Please fix it.") -> str:
    """A signed GitHub delivery of an issue labelled for a run; the one job id it queued."""
    from tests.conftest import github_payload

    response = post_github(github_payload(body_text=body_text), delivery=delivery)
    assert response.status_code == 202, response.content
    (job_id,) = response.json()["jobs"]
    return job_id
