"""GitLab: the declared mode only (`token`: X-Gitlab-Token; `signature`: Standard Webhooks), then the
payload subset matching needs. Routing reads the body's `object_kind`, never the header's words.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from . import repo_names
from .base import (
    MAX_EVENT,
    Actor,
    ForgeEvent,
    HookRefused,
    Verified,
    ascii_number,
    checked_delivery_id,
    digests_equal,
    header,
    names,
    numeric_id,
    obj,
    parse_json_object,
    positive_int,
    read_bounded_body,
    text,
)

FORGE = "gitlab"
SIGNATURE_TOLERANCE_SECONDS = 300
MR_ROUTE_ACTIONS = {"open", "update", "reopen", "approved"}
MR_LABEL_ACTIONS = {"open", "update", "reopen"}


def delivery_id_of(request) -> str:
    """`webhook-id` (GitLab 19+), `Idempotency-Key` (17.4+), else `X-Gitlab-Event-UUID`."""
    for name in ("webhook-id", "Idempotency-Key", "X-Gitlab-Event-UUID"):
        value = header(request, name)
        if value:
            return checked_delivery_id(value)
    raise HookRefused(400, "missing-delivery-id")


def verify_token(request, secret: bytes) -> None:
    given = header(request, "X-Gitlab-Token")
    if not given:
        raise HookRefused(401, "missing-token")
    if not digests_equal(secret, given.encode("utf-8", "surrogateescape")):
        raise HookRefused(401, "invalid-token")


def verify_signature(request, body: bytes, key: bytes, now: float | None = None) -> None:
    webhook_id = header(request, "webhook-id")
    timestamp = header(request, "webhook-timestamp")
    signatures = header(request, "webhook-signature")
    if not (webhook_id and timestamp and signatures):
        raise HookRefused(401, "missing-signature")
    seconds = ascii_number(timestamp, max_digits=12)
    if seconds is None:
        raise HookRefused(401, "invalid-timestamp")
    if abs((time.time() if now is None else now) - seconds) > SIGNATURE_TOLERANCE_SECONDS:
        raise HookRefused(401, "stale-timestamp")
    signed = f"{webhook_id}.{timestamp}.".encode("utf-8", "surrogateescape") + body
    expected = hmac.new(key, signed, hashlib.sha256).digest()
    for entry in signatures.split():
        version, _, encoded = entry.partition(",")
        if version != "v1":
            continue  # another scheme's signature; key rotation sends several
        try:
            given = base64.b64decode(encoded, validate=True)
        except ValueError:
            continue
        if hmac.compare_digest(expected, given):
            return
    raise HookRefused(401, "invalid-signature")


def verify(request, config) -> Verified:
    gitlab_event = header(request, "X-Gitlab-Event")
    if not gitlab_event:
        raise HookRefused(400, "missing-event-headers")
    delivery_id = delivery_id_of(request)
    body = read_bounded_body(request)
    if config.mode == "signature":
        verify_signature(request, body, config.signing_key)
    else:
        verify_token(request, config.token_secret)
    payload = parse_json_object(body)
    kind = text(payload.get("object_kind"))
    return Verified(event=(kind or gitlab_event)[:MAX_EVENT], delivery_id=delivery_id, body=body, payload=payload)


def _label_diff(payload: dict) -> tuple[bool, tuple[str, ...]]:
    """(the event changed labels, the labels it added); removing a label never adds anything."""
    change = obj(obj(payload.get("changes")).get("labels"))
    if not change:
        return False, ()
    previous = set(names(change.get("previous"), "title"))
    return True, tuple(name for name in names(change.get("current"), "title") if name not in previous)


def _labels(payload: dict, attrs: dict) -> tuple[str, ...]:
    return names(attrs.get("labels"), "title") or names(payload.get("labels"), "title")


def normalise(event: str, delivery_id: str, payload: dict) -> ForgeEvent:
    kind = text(payload.get("object_kind"))
    attrs = obj(payload.get("object_attributes"))
    action = text(attrs.get("action"))
    user = obj(payload.get("user"))
    project = obj(payload.get("project"))
    actor = Actor(id=numeric_id(user.get("id")), login=text(user.get("username")))
    common = {"forge": FORGE, "delivery_id": delivery_id, "event": kind or event, "action": action, "actor": actor}
    repo = text(project.get("path_with_namespace")).strip("/")
    if repo and repo_names.path_problem(repo, segments=None):
        raise HookRefused(400, "repository-invalid")
    project_id = (numeric_id(project.get("id")) or numeric_id(attrs.get("project_id"))
                  or numeric_id(attrs.get("target_project_id")) or numeric_id(payload.get("project_id")) or "")
    where = {"repo": repo, "project_id": project_id}

    if kind in ("issue", "work_item"):  # tasks, incidents and other work items share the issues' numbers
        if not repo:
            return ForgeEvent(route=None, drop="no-repository", **common)  # a group-level epic or the like
        number = positive_int(attrs.get("iid"))
        if number is None:
            raise HookRefused(400, "missing-issue-number")
        item = {"target_type": "issue", "number": number, "title": text(attrs.get("title")),
                "body": text(attrs.get("description"))}
        changed, added = _label_diff(payload)
        if action == "close":
            return ForgeEvent(route="close", rule_action="close", labels=added, label_fallback=bool(added),
                              **where, **item, **common)
        if action == "open":
            return ForgeEvent(route="label", rule_action=action, labels=_labels(payload, attrs),
                              **where, **item, **common)
        if not added:
            return ForgeEvent(route=None, drop="no-label-change", **where, **item, **common)
        return ForgeEvent(route="label", rule_action=action, labels=added, **where, **item, **common)

    if kind in ("merge_request", "note") and not repo:
        raise HookRefused(400, "missing-repository")

    if kind == "merge_request":
        number = positive_int(attrs.get("iid"))
        if number is None:
            raise HookRefused(400, "missing-pull-request")
        item = {"target_type": "pull_request", "number": number, "title": text(attrs.get("title")),
                "body": text(attrs.get("description"))}
        if action == "close":
            return ForgeEvent(route="close", rule_action="close", **where, **item, **common)
        if action in MR_ROUTE_ACTIONS:
            labels = _labels(payload, attrs) if action == "open" else _label_diff(payload)[1]
            # As on an issue: the labels the event added (all of them when it opens) are what a Label rule sees.
            return ForgeEvent(route="pull_request", rule_action=action, labels=labels,
                              label_arrival=action in MR_LABEL_ACTIONS and bool(labels), **where, **item, **common)
        return ForgeEvent(route=None, **where, **item, **common)  # merge, unapproved, ...: never fires

    if kind == "note" and action in ("", "create"):  # older GitLab sends no action on notes
        noteable = text(attrs.get("noteable_type"))
        if noteable not in ("Issue", "MergeRequest"):
            return ForgeEvent(route=None, **common)  # commits and snippets have nothing to work on
        is_mr = noteable == "MergeRequest"
        item = obj(payload.get("merge_request" if is_mr else "issue"))
        number = positive_int(item.get("iid"))
        if number is None:
            raise HookRefused(400, "missing-pull-request" if is_mr else "missing-issue-number")
        return ForgeEvent(
            route="comment", rule_action="create", target_type="pull_request" if is_mr else "issue", number=number,
            title=text(item.get("title")), body=text(item.get("description")), comment=text(attrs.get("note")),
            **where, **common,
        )

    return ForgeEvent(route=None, **common)
