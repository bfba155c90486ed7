"""What every forge arm shares: the refusal type, the bounded body read, constant-time compares, and the
forge-neutral event that matching reads.

Nothing here parses a body before its credential is checked: a forge module verifies the raw bytes (or
the request's credential) first and only then reads JSON.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from . import repo_names

READ_CHUNK = 64 * 1024
MAX_DELIVERY_ID = 200
MAX_EVENT = 64


class HookRefused(Exception):
    """A request answered without storing anything: status plus a stable error token."""

    def __init__(self, status: int, error: str):
        super().__init__(error)
        self.status = status
        self.error = error


@dataclass(frozen=True)
class Verified:
    """A request whose credential checked out and whose body is a JSON object."""

    event: str
    delivery_id: str
    body: bytes
    payload: dict


@dataclass(frozen=True)
class Actor:
    """Who caused the event. Only `id` ever leaves the receiver (job context); login and email exist to be
    handed to an authority lookup and are never logged or queued."""

    id: str | None  # numeric id (GitHub, GitLab, Forgejo), GUID or `azid-<hash>` (Azure); None = unknown
    login: str = ""
    email: str = ""
    association: str = ""  # GitHub `author_association` of the actor on this route


@dataclass(frozen=True)
class ForgeEvent:
    """A verified delivery, normalised to what matching needs (forge-neutral).

    `route` says which rules can fire: "label", "comment", "pull_request", "close"; None = nothing, and
    `drop` then names why (default `unhandled-event`). `rule_action` is the word rules list in `on.action`.
    """

    forge: str
    delivery_id: str
    event: str
    action: str
    route: str | None
    actor: Actor = field(default_factory=lambda: Actor(id=None))
    drop: str = ""
    rule_action: str = ""
    repo: str = ""
    project: str = ""  # Azure project name (the repo is `<project>/<repository>`)
    project_id: str = ""  # GitLab numeric project id; Azure project GUID
    repository_id: str = ""  # Azure repository GUID
    repo_from_rule: bool = False  # Azure work items: the rule's `run.repository` names the repository
    target_type: str = ""
    number: int | None = None
    labels: tuple[str, ...] = ()  # the label set predicates see (whole set, or only the added labels)
    label_fallback: bool = False  # GitLab: a close that also added labels may fire a label rule instead
    # A pull request event that brings labels the way an issue's label event does (labelled, opened or reopened
    # with labels, a GitLab label edit): Label rules are tried beside the pull request rules, in file order.
    label_arrival: bool = False
    pr_author: Actor = field(default_factory=lambda: Actor(id=None))  # GitHub: whose write access auto actions need
    # Container-only text, copied into the JobSpec and nowhere else.
    title: str = ""
    body: str = ""
    comment: str = ""
    review: dict[str, Any] | None = None  # GitHub reviews: id, state, body, author_association
    head: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)

    @property
    def drop_reason(self) -> str:
        return self.drop or "unhandled-event"


def header(request, name: str) -> str:
    return (request.headers.get(name) or "").strip()


def require_json_content_type(request) -> None:
    media_type = (request.META.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise HookRefused(415, "unsupported-media-type")


def ascii_number(value: str, max_digits: int = 18) -> int | None:
    """A numeric header's value: ASCII digits only, else None. (`str.isdigit` and `int` also take superscripts,
    other scripts' digits, signs, underscores and surrounding space; `int` raises on some of them.)"""
    if value and len(value) <= max_digits and value.isascii() and value.isdigit():
        return int(value)
    return None


def refuse_declared_oversize(request) -> None:
    declared = (request.META.get("CONTENT_LENGTH") or "").strip()
    if not declared:
        return
    length = ascii_number(declared)
    if length is None:
        raise HookRefused(400, "invalid-content-length")
    if length > settings.PI_WEBHOOK_MAX_BYTES:
        raise HookRefused(413, "payload-too-large")


def read_bounded_body(request) -> bytes:
    """The raw body, at most PI_WEBHOOK_MAX_BYTES; larger bodies are refused before and while reading."""
    refuse_declared_oversize(request)
    limit = settings.PI_WEBHOOK_MAX_BYTES
    chunks, total = [], 0
    while True:
        chunk = request.read(READ_CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if total > limit:
            raise HookRefused(413, "payload-too-large")
        chunks.append(chunk)
    return b"".join(chunks)


def hmac_sha256_hex(secret: bytes, body: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def constant_time_equal(expected: str | bytes, given: str | bytes) -> bool:
    expected = expected.encode() if isinstance(expected, str) else expected
    given = given.encode("utf-8", "surrogateescape") if isinstance(given, str) else given
    return hmac.compare_digest(expected, given)


def digests_equal(expected: bytes, given: bytes) -> bool:
    """Compare two secrets through their SHA-256 digests, so neither length nor content leaks."""
    return hmac.compare_digest(hashlib.sha256(expected).digest(), hashlib.sha256(given).digest())


def parse_json_object(body: bytes) -> dict:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise HookRefused(400, "invalid-json") from None
    if not isinstance(payload, dict):
        raise HookRefused(400, "invalid-json")
    return payload


def checked_delivery_id(value: str) -> str:
    if not value:
        raise HookRefused(400, "missing-delivery-id")
    if len(value) > MAX_DELIVERY_ID or any(ord(ch) < 32 for ch in value):
        raise HookRefused(400, "invalid-delivery-id")
    return value


# --- reading untrusted JSON without ever raising ---------------------------------------------------------

def obj(value) -> dict:
    return value if isinstance(value, dict) else {}


def text(value) -> str:
    return value if isinstance(value, str) else ""


def positive_int(value) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63:
        return value
    return None


def numeric_id(value) -> str | None:
    """A real numeric account id as text; anything else (missing, string, bool) fails closed."""
    number = positive_int(value)
    return str(number) if number is not None else None


def names(items, key: str) -> tuple[str, ...]:
    """Label names from a list of label objects (`name` on GitHub/Forgejo, `title` on GitLab)."""
    if not isinstance(items, list):
        return ()
    found = []
    for item in items:
        name = item.get(key) if isinstance(item, dict) else None
        if isinstance(name, str) and name and name not in found:
            found.append(name)
    return tuple(found)


def numbered(item: dict, missing: str) -> int:
    """The item's `number`, or a 400 naming what is missing (an event that cannot say what it is about)."""
    number = positive_int(item.get("number"))
    if number is None:
        raise HookRefused(400, missing)
    return number


def full_name(payload: dict) -> str:
    """`repository.full_name` of a GitHub or Forgejo payload, or a 400."""
    repo = owner_repo(obj(payload.get("repository")).get("full_name"))
    if not repo:
        raise HookRefused(400, "missing-repository")
    return repo


def owner_repo(value) -> str:
    """`owner/name` or "" (the only shape GitHub and Forgejo repositories have); a name no forge could have
    written is refused (repo_names.py)."""
    repo = text(value)
    if not repo:
        return ""
    if repo_names.path_problem(repo, segments=2):
        raise HookRefused(400, "repository-invalid")
    return repo
