"""What every forge arm shares: the refusal type, the bounded body read, and the constant-time compare.

Nothing here parses a body: a forge module verifies the raw bytes first and only then reads JSON.
"""

import hmac
import json
from dataclasses import dataclass, field

from django.conf import settings

READ_CHUNK = 64 * 1024


class HookRefused(Exception):
    """A request answered without storing anything: status plus a stable error token."""

    def __init__(self, status: int, error: str):
        super().__init__(error)
        self.status = status
        self.error = error


@dataclass(frozen=True)
class ForgeEvent:
    """A verified delivery, normalised to what matching needs (forge-neutral)."""

    forge: str
    delivery_id: str
    event: str
    action: str
    route: str | None  # "label" when the event can fire label triggers; None = nothing handles it
    repo: str = ""
    target_type: str = ""
    number: int | None = None
    labels: tuple[str, ...] = ()
    actor_id: str | None = None
    # Container-only text, copied into the JobSpec and nowhere else.
    title: str = ""
    body: str = ""
    extra_context: dict = field(default_factory=dict)


def require_json_content_type(request) -> None:
    media_type = (request.META.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise HookRefused(415, "unsupported-media-type")


def read_bounded_body(request) -> bytes:
    """The raw body, at most PI_WEBHOOK_MAX_BYTES; larger bodies are refused before and while reading."""
    limit = settings.PI_WEBHOOK_MAX_BYTES
    declared = request.META.get("CONTENT_LENGTH") or ""
    if declared.strip():
        try:
            if int(declared) > limit:
                raise HookRefused(413, "payload-too-large")
        except ValueError:
            raise HookRefused(400, "invalid-content-length") from None
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
    return hmac.new(secret, body, "sha256").hexdigest()


def constant_time_equal(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected.encode(), given.encode())


def parse_json_object(body: bytes) -> dict:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise HookRefused(400, "invalid-json") from None
    if not isinstance(payload, dict):
        raise HookRefused(400, "invalid-json")
    return payload
