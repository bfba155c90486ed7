"""Azure DevOps service hooks: no signature exists, so the declared credential (basic authentication or a
named custom header) is compared in constant time; the delivery id is the body's `id`.
"""

from __future__ import annotations

import hashlib
import re

from . import repo_names
from .base import (
    MAX_EVENT,
    Actor,
    ForgeEvent,
    HookRefused,
    Verified,
    checked_delivery_id,
    digests_equal,
    names,
    obj,
    parse_json_object,
    positive_int,
    read_bounded_body,
    refuse_declared_oversize,
    text,
)

FORGE = "azure"
GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
EMAIL_IN_ANGLES = re.compile(r"<([^<>\s]+@[^<>\s]+)>\s*$")
BARE_EMAIL = re.compile(r"^[^<>\s@]+@[^<>\s@]+$")
PR_COMMENT_EVENT = "ms.vss-code.git-pullrequest-comment-event"
PR_EVENTS = {"git.pullrequest.created": "created", "git.pullrequest.updated": "updated"}


def verify_credential(request, config) -> None:
    if config.mode == "basic":
        given = request.headers.get("Authorization") or ""
        if not given:
            raise HookRefused(401, "missing-credential")
        if not given.startswith("Basic "):
            raise HookRefused(401, "invalid-credential")
        given = given[len("Basic "):].strip()
    else:
        given = request.headers.get(config.header) or ""
        if not given:
            raise HookRefused(401, "missing-credential")
    if not digests_equal(config.credential, given.encode("utf-8", "surrogateescape")):
        raise HookRefused(401, "invalid-credential")


def verify(request, config) -> Verified:
    refuse_declared_oversize(request)
    verify_credential(request, config)
    body = read_bounded_body(request)
    payload = parse_json_object(body)
    delivery_id = checked_delivery_id(text(payload.get("id")).strip())
    return Verified(event=text(payload.get("eventType"))[:MAX_EVENT], delivery_id=delivery_id, body=body,
                    payload=payload)


def _email(value) -> str:
    """An address from `Name <addr>` or a bare address; a display name alone is no identity."""
    raw = text(value).strip()
    if not raw:
        return ""
    match = EMAIL_IN_ANGLES.search(raw)
    if match:
        return match.group(1).lower()
    return raw.lower() if BARE_EMAIL.fullmatch(raw) else ""


def _guid(person) -> str:
    value = text(obj(person).get("id"))
    return value.lower() if GUID.fullmatch(value) else ""


def _actor(resource: dict, fields: dict) -> Actor:
    guid = (_guid(resource.get("revisedBy")) or _guid(resource.get("createdBy"))
            or _guid(obj(resource.get("comment")).get("author"))
            or _guid(obj(resource.get("pullRequest")).get("createdBy")))
    if guid:
        return Actor(id=guid)
    changed_by = fields.get("System.ChangedBy")
    if isinstance(changed_by, dict):  # workitem.updated lists changes as {oldValue, newValue}
        changed_by = changed_by.get("newValue")
    email = _email(changed_by) or _email(fields.get("System.CreatedBy"))
    if email:
        # The record keeps a stable pseudonym, never the address.
        return Actor(id="azid-" + hashlib.sha256(email.encode()).hexdigest()[:16], email=email)
    return Actor(id=None)


def _tags(value) -> tuple[str, ...]:
    seen = []
    for part in text(value).split(";"):
        tag = part.strip()
        if tag and tag not in seen:
            seen.append(tag)
    return tuple(seen)


def _pr_labels(pull: dict) -> tuple[str, ...]:
    """The active labels of a pull request resource (`labels[].name`, `active` false once removed)."""
    items = pull.get("labels")
    active = [item for item in items if isinstance(item, dict) and item.get("active", True) is not False] \
        if isinstance(items, list) else []
    return names(active, "name")


def _ref_name(value) -> str:
    ref = text(value)
    return ref[len("refs/heads/"):] if ref.startswith("refs/heads/") else ref


def normalise(event: str, delivery_id: str, payload: dict) -> ForgeEvent:
    event_type = text(payload.get("eventType"))
    resource = obj(payload.get("resource"))
    project_guid = text(obj(obj(payload.get("resourceContainers")).get("project")).get("id"))
    common = {"forge": FORGE, "delivery_id": delivery_id, "event": event_type or event}

    if event_type in ("workitem.created", "workitem.updated", "workitem.commented"):
        revision_fields = obj(obj(resource.get("revision")).get("fields"))
        fields = obj(resource.get("fields"))
        current = revision_fields or fields
        actor = _actor(resource, fields)
        action = event_type.split(".", 1)[1]
        number = positive_int(resource.get("workItemId")) or positive_int(resource.get("id"))
        if number is None:
            raise HookRefused(400, "missing-issue-number")
        project = text(current.get("System.TeamProject"))
        if project and repo_names.azure_name_problem(project):
            raise HookRefused(400, "repository-invalid")
        item = {
            "target_type": "issue", "number": number, "title": text(current.get("System.Title")),
            "body": text(current.get("System.Description")), "project": project,
            "project_id": project_guid.lower() if GUID.fullmatch(project_guid) else "", "repo_from_rule": True,
        }
        if action == "commented":
            return ForgeEvent(route="comment", action=action, rule_action=action, actor=actor,
                              comment=text(current.get("System.History")) or text(fields.get("System.History")),
                              **item, **common)
        if action == "created":
            return ForgeEvent(route="label", action=action, rule_action=action, actor=actor,
                              labels=_tags(current.get("System.Tags")), **item, **common)
        change = fields.get("System.Tags")
        if not isinstance(change, dict):
            return ForgeEvent(route=None, drop="no-label-change", action=action, actor=actor, **item, **common)
        previous = set(_tags(change.get("oldValue")))
        added = tuple(tag for tag in _tags(change.get("newValue")) if tag not in previous)
        if not added:
            return ForgeEvent(route=None, drop="no-label-change", action=action, actor=actor, **item, **common)
        return ForgeEvent(route="label", action=action, rule_action=action, actor=actor, labels=added,
                          **item, **common)

    if event_type in PR_EVENTS or event_type == PR_COMMENT_EVENT:
        is_comment = event_type == PR_COMMENT_EVENT
        pull = obj(resource.get("pullRequest")) if is_comment else resource
        actor = _actor(resource, {})
        action = "commented" if is_comment else PR_EVENTS[event_type]
        repository = obj(pull.get("repository"))
        project = obj(repository.get("project"))
        number = positive_int(pull.get("pullRequestId"))
        if number is None:
            raise HookRefused(400, "missing-pull-request")
        project_name, repo_name = text(project.get("name")), text(repository.get("name"))
        if not project_name or not repo_name:
            return ForgeEvent(route=None, drop="no-repository", action=action, actor=actor, **common)
        if repo_names.azure_name_problem(project_name) or repo_names.azure_name_problem(repo_name):
            raise HookRefused(400, "repository-invalid")
        project_id = text(project.get("id")) or project_guid
        # Azure sends a pull request's labels (tags) with the pull request, but no diff of them: only a new pull
        # request's labels are an arrival; on `updated` they would fire again on every push.
        labels = _pr_labels(pull) if action == "created" else ()
        return ForgeEvent(
            route="comment" if is_comment else "pull_request", action=action, rule_action=action, actor=actor,
            repo=f"{project_name}/{repo_name}", project=project_name,
            project_id=project_id.lower() if GUID.fullmatch(project_id) else "",
            repository_id=text(repository.get("id")), target_type="pull_request", number=number,
            labels=labels, label_arrival=bool(labels),
            title=text(pull.get("title")), body=text(pull.get("description")),
            comment=text(obj(resource.get("comment")).get("content")) if is_comment else "",
            head={"ref": _ref_name(pull.get("sourceRefName"))} if text(pull.get("sourceRefName")) else {},
            base={"ref": _ref_name(pull.get("targetRefName"))} if text(pull.get("targetRefName")) else {},
            **common,
        )

    return ForgeEvent(route=None, action="", actor=_actor(resource, obj(resource.get("fields"))), **common)
