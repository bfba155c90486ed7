"""GitHub: `X-Hub-Signature-256` over the raw body, then the payload subset matching needs."""

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
    positive_int,
    read_bounded_body,
    text,
)

FORGE = "github"
SIGNATURE_PREFIX = "sha256="
LABEL_ROUTE_ACTIONS = {"opened", "labeled", "reopened"}
PR_ROUTE_ACTIONS = {"labeled", "opened", "synchronize", "reopened"}


def verify_signature(given: str, body: bytes, secret: bytes) -> None:
    if not given.startswith(SIGNATURE_PREFIX):
        raise HookRefused(401, "invalid-signature")
    if not constant_time_equal(SIGNATURE_PREFIX + hmac_sha256_hex(secret, body), given):
        raise HookRefused(401, "invalid-signature")


def verify(request, config) -> Verified:
    if not header(request, "X-Hub-Signature-256"):
        raise HookRefused(401, "missing-signature")
    event = header(request, "X-GitHub-Event")
    delivery_id = header(request, "X-GitHub-Delivery")
    if not event or not delivery_id:
        raise HookRefused(400, "missing-event-headers")
    checked_delivery_id(delivery_id)
    body = read_bounded_body(request)
    verify_signature(header(request, "X-Hub-Signature-256"), body, config.webhook_secret)
    payload = parse_json_object(body)  # only after verification
    return Verified(event=event[:MAX_EVENT], delivery_id=delivery_id, body=body, payload=payload)


def _issue(payload: dict) -> tuple[dict, int]:
    issue = obj(payload.get("issue"))
    return issue, numbered(issue, "missing-issue-number")


def _pull_request(payload: dict) -> tuple[dict, int]:
    pull = obj(payload.get("pull_request"))
    return pull, numbered(pull, "missing-pull-request")


def _refs(pull: dict) -> tuple[dict, dict]:
    head, base = obj(pull.get("head")), obj(pull.get("base"))
    head_refs = {"ref": text(head.get("ref")), "sha": text(head.get("sha")),
                 "repo": text(obj(head.get("repo")).get("full_name"))}
    return ({k: v for k, v in head_refs.items() if v},
            {"ref": text(base.get("ref"))} if text(base.get("ref")) else {})


def _account(value) -> Actor:
    """A user object (`sender`, `pull_request.user`) as an Actor."""
    user = obj(value)
    return Actor(id=numeric_id(user.get("id")), login=text(user.get("login")))


def normalise(event: str, delivery_id: str, payload: dict) -> ForgeEvent:
    action = text(payload.get("action"))
    actor = _account(payload.get("sender"))
    common = {"forge": FORGE, "delivery_id": delivery_id, "event": event, "action": action}

    if event == "issues" and action in LABEL_ROUTE_ACTIONS | {"closed"}:
        repo = full_name(payload)
        issue, number = _issue(payload)
        return ForgeEvent(
            route="label" if action != "closed" else "close", rule_action=action, actor=actor, repo=repo,
            target_type="issue", number=number, labels=names(issue.get("labels"), "name"),
            title=text(issue.get("title")), body=text(issue.get("body")), **common,
        )

    if event == "issue_comment" and action == "created":
        repo = full_name(payload)
        issue, number = _issue(payload)
        comment = obj(payload.get("comment"))
        association = text(comment.get("author_association"))
        return ForgeEvent(
            route="comment", rule_action=action, repo=repo, number=number,
            actor=Actor(id=actor.id, login=actor.login, association=association),
            target_type="pull_request" if "pull_request" in issue else "issue",
            title=text(issue.get("title")), body=text(issue.get("body")), comment=text(comment.get("body")),
            **common,
        )

    if event == "pull_request" and action in PR_ROUTE_ACTIONS | {"closed"}:
        repo = full_name(payload)
        pull, number = _pull_request(payload)
        head, base = _refs(pull)
        return ForgeEvent(
            route="pull_request" if action != "closed" else "close", rule_action=action, actor=actor, repo=repo,
            target_type="pull_request", number=number, labels=names(pull.get("labels"), "name"),
            label_arrival=action in LABEL_ROUTE_ACTIONS,
            pr_author=_account(pull.get("user")), title=text(pull.get("title")),
            body=text(pull.get("body")), head=head, base=base, **common,
        )

    if event == "pull_request_review" and action == "submitted":
        repo = full_name(payload)
        pull, number = _pull_request(payload)
        review = obj(payload.get("review"))
        association = text(review.get("author_association"))
        head, base = _refs(pull)
        return ForgeEvent(
            route="pull_request", rule_action="review_submitted", repo=repo, target_type="pull_request",
            number=number, actor=Actor(id=actor.id, login=actor.login, association=association),
            labels=names(pull.get("labels"), "name"), title=text(pull.get("title")), body=text(pull.get("body")),
            comment=text(review.get("body")), head=head, base=base,
            review={"id": positive_int(review.get("id")), "state": text(review.get("state")).lower(),
                    "body": text(review.get("body")), "author_association": association},
            **common,
        )

    return ForgeEvent(route=None, actor=actor, **common)
