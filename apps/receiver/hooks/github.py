"""GitHub: `X-Hub-Signature-256` over the raw body, then the payload subset matching needs."""

from .base import ForgeEvent, HookRefused, constant_time_equal, hmac_sha256_hex

FORGE = "github"
SIGNATURE_PREFIX = "sha256="
LABEL_ROUTE_ACTIONS = {"opened", "labeled", "reopened"}


def delivery_headers(request) -> tuple[str, str]:
    """(event, delivery id), checked before the body is read."""
    if not request.META.get("HTTP_X_HUB_SIGNATURE_256"):
        raise HookRefused(401, "missing-signature")
    event = (request.META.get("HTTP_X_GITHUB_EVENT") or "").strip()
    delivery_id = (request.META.get("HTTP_X_GITHUB_DELIVERY") or "").strip()
    if not event or not delivery_id:
        raise HookRefused(400, "missing-event-headers")
    return event, delivery_id


def verify(request, body: bytes, secret: bytes) -> None:
    given = request.META.get("HTTP_X_HUB_SIGNATURE_256", "")
    if not given.startswith(SIGNATURE_PREFIX):
        raise HookRefused(401, "invalid-signature")
    if not constant_time_equal(SIGNATURE_PREFIX + hmac_sha256_hex(secret, body), given):
        raise HookRefused(401, "invalid-signature")


def _labels(item: dict) -> tuple[str, ...]:
    raw = item.get("labels")
    if not isinstance(raw, list):
        return ()
    return tuple(
        label["name"] for label in raw if isinstance(label, dict) and isinstance(label.get("name"), str)
    )


def _actor_id(payload: dict) -> str | None:
    sender = payload.get("sender")
    sender_id = sender.get("id") if isinstance(sender, dict) else None
    # Fail closed: only a real numeric id can be compared with our own identity.
    if isinstance(sender_id, int) and not isinstance(sender_id, bool):
        return str(sender_id)
    return None


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def normalise(event: str, delivery_id: str, payload: dict) -> ForgeEvent:
    action = _text(payload.get("action"))
    common = {"forge": FORGE, "delivery_id": delivery_id, "event": event, "action": action}

    if event != "issues" or action not in LABEL_ROUTE_ACTIONS:
        return ForgeEvent(route=None, actor_id=_actor_id(payload), **common)

    repository = payload.get("repository")
    repo = repository.get("full_name") if isinstance(repository, dict) else None
    issue = payload.get("issue")
    number = issue.get("number") if isinstance(issue, dict) else None
    if not isinstance(repo, str) or repo.count("/") != 1 or not all(repo.split("/")):
        raise HookRefused(400, "missing-repository")
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise HookRefused(400, "missing-issue-number")

    return ForgeEvent(
        route="label",
        repo=repo,
        target_type="issue",
        number=number,
        labels=_labels(issue),
        actor_id=_actor_id(payload),
        title=_text(issue.get("title")),
        body=_text(issue.get("body")),
        **common,
    )
