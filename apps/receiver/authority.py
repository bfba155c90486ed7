"""The forge-API half of the actor gates: may this actor start the job a rule matched?

Matching says which lookup a match still needs; this asks the forge (`apps.worker.forges`) and keeps the
tri-state: allowed, refused, or "could not tell" (the delivery then stays pending and is retried).
"""

from __future__ import annotations

from apps import forge_registry
from apps.worker.forges import Authority, Subject, forge_client

from .hooks.base import ForgeEvent

# The inbox reason of a delivery whose lookup could not be answered (the ancestor's 503 tokens).
PENDING_REASONS = {forge.name: forge.lookup_pending_reason for forge in forge_registry.FORGES}


def subject_of(event: ForgeEvent, whom: str = "actor") -> Subject:
    """`whom`: a Match's `authority` ("pr-author" is the pull request's author, anything else the actor)."""
    actor = event.pr_author if whom == "pr-author" else event.actor
    return Subject(repo=event.repo, project_id=event.project_id, actor_id=actor.id or "", login=actor.login,
                   email=actor.email)


def check(event: ForgeEvent, whom: str = "actor") -> Authority:
    return forge_client(event.forge).authority(subject_of(event, whom))
