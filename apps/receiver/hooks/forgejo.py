"""Forgejo and Gitea (and the Gogs format they extend): a bare-hex HMAC-SHA256 of the raw body in
`X-Forgejo-Signature` / `X-Gitea-Signature` / `X-Gogs-Signature`, or GitHub's `X-Hub-Signature-256`.

Forgejo also sends GitHub's header names, which is why forges are told apart by URL path, never by header.
Rules list Forgejo's own action words (`label_updated`, `synchronized`); matching uses them as sent.
"""

from __future__ import annotations

from .base import (
    MAX_EVENT,
    Actor,
    ForgeEvent,
    HookRefused,
    Verified,
    checked_delivery_id,
    constant_time_equal,
    full_name,
    header,
    hmac_sha256_hex,
    names,
    numbered,
    numeric_id,
    obj,
    parse_json_object,
    read_bounded_body,
    text,
)
from .github import verify_signature as verify_github_signature

FORGE = "forgejo"
HEX_SIGNATURE_HEADERS = ("X-Forgejo-Signature", "X-Gitea-Signature", "X-Gogs-Signature")
EVENT_HEADERS = ("X-Forgejo-Event", "X-Gitea-Event", "X-Gogs-Event", "X-GitHub-Event")
DELIVERY_HEADERS = ("X-Forgejo-Delivery", "X-Gitea-Delivery", "X-Gogs-Delivery", "X-GitHub-Delivery")

ISSUE_ACTIONS = {"opened": "opened", "reopened": "reopened", "label_updated": "labeled", "closed": "closed"}
PR_ACTIONS = {**ISSUE_ACTIONS, "synchronized": "synchronize"}
# The pull request actions a Label rule sees, as on an issue: the item's whole label set, never a push.
LABEL_ARRIVAL_ACTIONS = {"opened", "reopened", "labeled"}
IGNORED_ACTIONS = {
    "label_cleared", "edited", "assigned", "unassigned", "milestoned", "demilestoned", "reviewed",
    "review_requested", "review_request_removed",
}
RECOGNISED_ACTIONS = set(PR_ACTIONS) | IGNORED_ACTIONS | {"created"}


def _first(request, names_: tuple[str, ...]) -> str:
    return next((value for value in (header(request, name) for name in names_) if value), "")


def verify(request, config) -> Verified:
    hex_signature = _first(request, HEX_SIGNATURE_HEADERS)
    hub_signature = header(request, "X-Hub-Signature-256")
    if not hex_signature and not hub_signature:
        raise HookRefused(401, "missing-signature")
    event, delivery_id = _first(request, EVENT_HEADERS), _first(request, DELIVERY_HEADERS)
    if not event or not delivery_id:
        raise HookRefused(400, "missing-event-headers")
    checked_delivery_id(delivery_id)
    body = read_bounded_body(request)
    if hex_signature:
        if not constant_time_equal(hmac_sha256_hex(config.webhook_secret, body), hex_signature.lower()):
            raise HookRefused(401, "invalid-signature")
    else:
        verify_github_signature(hub_signature, body, config.webhook_secret)
    payload = parse_json_object(body)
    return Verified(event=event[:MAX_EVENT], delivery_id=delivery_id, body=body, payload=payload)


def _not_actionable(action: str) -> str:
    return "action-not-actionable" if action in RECOGNISED_ACTIONS else "unhandled-event"


def _refs(pull: dict) -> tuple[dict, dict]:
    head, base = obj(pull.get("head")), obj(pull.get("base"))
    head_refs = {key: text(head.get(key)) for key in ("ref", "sha") if text(head.get(key))}
    head_repo = text(obj(head.get("repo")).get("full_name"))
    if head_repo:
        head_refs["repo"] = {"full_name": head_repo}
    return head_refs, ({"ref": text(base.get("ref"))} if text(base.get("ref")) else {})


def normalise(event: str, delivery_id: str, payload: dict) -> ForgeEvent:
    action = text(payload.get("action"))
    sender = obj(payload.get("sender"))
    actor = Actor(id=numeric_id(sender.get("id")), login=text(sender.get("login")) or text(sender.get("username")))
    common = {"forge": FORGE, "delivery_id": delivery_id, "event": event, "action": action, "actor": actor}

    if event == "issue_comment":
        if action != "created":
            return ForgeEvent(route=None, drop=_not_actionable(action), **common)
        repo = full_name(payload)
        issue = obj(payload.get("issue"))
        number = numbered(issue, "missing-issue-number")
        comment = obj(payload.get("comment"))
        return ForgeEvent(
            route="comment", rule_action=action, repo=repo, number=number,
            target_type="pull_request" if payload.get("is_pull") is True else "issue",
            title=text(issue.get("title")), body=text(issue.get("body")), comment=text(comment.get("body")),
            **common,
        )

    if event == "issues":
        if action not in ISSUE_ACTIONS:
            return ForgeEvent(route=None, drop=_not_actionable(action), **common)
        repo = full_name(payload)
        issue = obj(payload.get("issue"))
        number = numbered(issue, "missing-issue-number")
        return ForgeEvent(
            route="close" if action == "closed" else "label", rule_action=action, repo=repo, target_type="issue",
            number=number, labels=names(issue.get("labels"), "name"), title=text(issue.get("title")),
            body=text(issue.get("body")), **common,
        )

    if event == "pull_request":
        if action not in PR_ACTIONS:
            return ForgeEvent(route=None, drop=_not_actionable(action), **common)
        repo = full_name(payload)
        pull = obj(payload.get("pull_request"))
        number = numbered(pull, "missing-pull-request")
        head, base = _refs(pull)
        return ForgeEvent(
            route="close" if action == "closed" else "pull_request", rule_action=action, repo=repo,
            target_type="pull_request", number=number, labels=names(pull.get("labels"), "name"),
            label_arrival=ISSUE_ACTIONS.get(action) in LABEL_ARRIVAL_ACTIONS,
            title=text(pull.get("title")), body=text(pull.get("body")), head=head, base=base, **common,
        )

    return ForgeEvent(route=None, drop="action-not-actionable" if action in IGNORED_ACTIONS else "", **common)
