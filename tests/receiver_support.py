"""Shared by the receiver and forge-client tests: deliveries signed exactly as each forge signs them, and a
small local HTTP server standing in for the forges' APIs (their SaaS cannot run here).

Import the fixtures you use: `from tests.receiver_support import fake_forge, forges  # noqa: F401`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

PAYLOADS = Path(__file__).resolve().parent / "payloads"
CORPUS = Path(__file__).resolve().parent / "payloads" / "corpus"  # a copy of ../shared/corpus (Zulip fixtures, Apache-2.0)

GITHUB_SECRET = "test-webhook-secret"
GITLAB_TOKEN_SECRET = "gitlab-shared-token"
GITLAB_SIGNING_KEY = base64.b64encode(b"k" * 32).decode()
GITLAB_SIGNING_SECRET = "whsec_" + GITLAB_SIGNING_KEY
FORGEJO_SECRET = "forgejo-webhook-secret"
AZURE_USER, AZURE_PASSWORD = "pidispatch", "azure-hook-password"
AZURE_HEADER, AZURE_HEADER_VALUE = "X-Pi-Hook-Key", "azure-header-secret"

SELF_IDS = {"github": "424242", "gitlab": "900001", "forgejo": "900002",
            "azure": "0f0f0f0f-1111-2222-3333-444444444444"}
AZURE_PROJECT_ID = "068d2409-14eb-4d8a-88bf-c8a9e7f5b4e2"


def load(relative: str) -> dict:
    return json.loads((PAYLOADS / relative).read_text())


def dumps(payload: dict) -> bytes:
    return json.dumps(payload).encode()


# --- signing as the forges do ------------------------------------------------------------------------------

def github_headers(body: bytes, event: str, delivery: str, secret: str = GITHUB_SECRET) -> dict:
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": signature,
            "X-GitHub-Hook-ID": "4711", "User-Agent": "GitHub-Hookshot/abc"}


def gitlab_token_headers(event: str, delivery: str, token: str = GITLAB_TOKEN_SECRET) -> dict:
    return {"X-Gitlab-Event": event, "X-Gitlab-Token": token, "Idempotency-Key": delivery,
            "X-Gitlab-Event-UUID": str(uuid.uuid4()), "X-Gitlab-Webhook-UUID": str(uuid.uuid4()),
            "X-Gitlab-Instance": "https://gitlab.example.com", "User-Agent": "GitLab/17.6.0"}


def gitlab_signature_headers(body: bytes, event: str, delivery: str, *, key: str = GITLAB_SIGNING_KEY,
                             timestamp: int | None = None) -> dict:
    """Standard Webhooks: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    signed = f"{delivery}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.new(base64.b64decode(key), signed, hashlib.sha256).digest()).decode()
    return {"X-Gitlab-Event": event, "webhook-id": delivery, "webhook-timestamp": str(timestamp),
            "webhook-signature": f"v1,{signature}", "Idempotency-Key": delivery, "User-Agent": "GitLab/19.1.0"}


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


# --- a stand-in for the forges' APIs ---------------------------------------------------------------------------

class FakeForge:
    """A local HTTP server answering JSON per path. `routes[path] = (status, body[, headers])` or a callable
    taking the parsed request; every request is recorded (method, path, query, headers)."""

    def __init__(self):
        self.routes: dict = {}
        self.fallback = None  # answers paths without a route (default: 404)
        self.requests: list[dict] = []
        forge = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                parts = urlsplit(self.path)
                request = {"method": "GET", "path": parts.path, "query": parse_qs(parts.query),
                           "headers": {k.lower(): v for k, v in self.headers.items()}}
                forge.requests.append(request)
                route = forge.routes.get(parts.path, forge.fallback)
                if callable(route):
                    route = route(request)
                if route is None:
                    route = (404, {"message": "404 Not Found"})
                status, body, *extra = route
                if isinstance(body, float):  # a delay in seconds: answer too late
                    time.sleep(body)
                    status, body = 200, {}
                payload = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in (extra[0] if extra else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False  # a deliberately slow answer must not hold up the test's teardown
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def paths(self) -> list[str]:
        return [request["path"] for request in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    # --- typical answers ---

    def github_permission(self, repo: str, login: str, permission: str | None, status: int = 200):
        self.routes[f"/repos/{repo}/collaborators/{login}/permission"] = (
            status, {"permission": permission, "role_name": permission, "user": {"login": login}})

    def gitlab_member(self, project: str, user_id: str | int, access_level: int | None, status: int = 200):
        self.routes[f"/api/v4/projects/{project}/members/all/{user_id}"] = (
            status, {"id": int(user_id), "username": "someone", "access_level": access_level, "state": "active"})

    def forgejo_permission(self, repo: str, login: str, permission: str | None, status: int = 200):
        self.routes[f"/api/v1/repos/{repo}/collaborators/{login}/permission"] = (
            status, {"permission": permission, "role_name": permission, "user": {"login": login}})

    def azure_member(self, actor_guid: str, project_id: str = AZURE_PROJECT_ID, member: bool = True):
        """The Graph answers for: actor descriptor, project descriptor, project groups, actor memberships."""
        actor_descriptor = f"aad.{actor_guid[:8]}"
        project_descriptor = f"scp.{project_id[:8]}"
        contributors, readers = f"vssgp.contrib{project_id[:4]}", f"vssgp.readers{project_id[:4]}"
        self.routes[f"/_apis/graph/descriptors/{actor_guid}"] = (200, {"value": actor_descriptor})
        self.routes[f"/_apis/graph/descriptors/{project_id}"] = (200, {"value": project_descriptor})
        self.routes["/_apis/graph/groups"] = (200, {"count": 2, "value": [
            {"descriptor": contributors, "displayName": "Contributors", "principalName": "[P]\\Contributors"},
            {"descriptor": readers, "displayName": "Readers", "principalName": "[P]\\Readers"},
        ]})
        self.routes[f"/_apis/graph/memberships/{actor_descriptor}"] = (200, {"count": 1, "value": [
            {"containerDescriptor": contributors if member else readers, "memberDescriptor": actor_descriptor},
        ]})


@pytest.fixture
def fake_forge():
    from apps.worker.forges.azure import AzureClient
    from apps.worker.forges.base import ForgeClient

    ForgeClient.authority_cache.clear()
    AzureClient.project_groups_cache.clear()
    server = FakeForge()
    yield server
    server.close()
    ForgeClient.authority_cache.clear()
    AzureClient.project_groups_cache.clear()


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
