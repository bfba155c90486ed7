"""Matching: a verified, normalised event against the enabled triggers, behind the actor gates.

Pure apart from reading Trigger rows: it decides, it does not enqueue. Gate order (reference 4.1):
actor id present, bot-loop guard, then the route's own rules.
"""

from dataclasses import dataclass, field

from apps.worker.jobs import JobSpec, delivery_job_id

from .hooks.base import ForgeEvent
from .models import Trigger


@dataclass(frozen=True)
class Decision:
    specs: list[JobSpec] = field(default_factory=list)
    reason: str = ""  # the drop token when nothing fires


def decide(event: ForgeEvent, self_id: str) -> Decision:
    if event.actor_id is None:
        return Decision(reason="missing-sender-id")
    if event.actor_id == self_id:
        return Decision(reason="self")
    if event.route == "label":
        return _label_route(event)
    return Decision(reason="unhandled-event")


def _label_route(event: ForgeEvent) -> Decision:
    for trigger in Trigger.objects.armed_for(event.forge, "label"):
        if trigger.labels_match(event.labels):
            return Decision(specs=[_spec(event, trigger, matched_label=trigger.matched_label(event.labels))])
    return Decision(reason="no-allowlisted-label")


def _spec(event: ForgeEvent, trigger: Trigger, matched_label: str | None) -> JobSpec:
    return JobSpec(
        job_id=delivery_job_id(event.forge, event.delivery_id),
        kind=event.forge,
        repo=event.repo,
        target_type=event.target_type,
        number=event.number,
        flow=trigger.flow,
        title=event.title,
        body=event.body,
        trigger_id=trigger.pk,
        trigger_type=trigger.on_type,
        delivery_id=event.delivery_id,
        context={
            "event": event.event,
            "action": event.action,
            "deliveryId": event.delivery_id,
            "sender": {"id": event.actor_id},
            "matched": {"index": trigger.position, "type": trigger.on_type, "label": matched_label},
        },
    )
