"""The page's side: what one job's live page and the runs list's "running now" read (see the package's docstring)."""

from __future__ import annotations

import json

from django.urls import reverse
from redis.exceptions import RedisError

from apps.fleet import job_states
from apps.fleet.connection import get_redis, text
from apps.worker import run_logs
from apps.worker.gates.ladder import GATES
from apps.worker.models import Run
from apps.worker.progress.tracker import RUNNING, key, log_key

# Each phase token as the page says it (a `deferred:<reason>` reads "deferred (<reason>)"): the gates' own, declared
# with them (ladder.GATES), between the worker's.
PHASES = {
    "queued": "queued",
    "picked-up": "picked up by a worker",
    **{gate.phase: gate.phase_label for gate in GATES if gate.phase},
    "recorded": "run recorded",
}
ENDED_STATES = ("completed", "policy", "failed", "cancelled")


def phase_label(token: str) -> str:
    if token.startswith("deferred:"):
        return f"deferred ({token.split(':', 1)[1]})"
    return PHASES.get(token, token)


def _progress(redis, job_id: str) -> dict:
    fields = {text(name): text(value) for name, value in redis.hgetall(key(job_id)).items()}
    try:
        phases = json.loads(fields.get("phases") or "[]")
    except ValueError:
        phases = []
    return {
        "attempt": int(fields["attempt"]) if fields.get("attempt", "").isdigit() else None,
        "host": fields.get("host", ""),
        "state": fields.get("state", ""),
        "phases": [{"phase": token, "label": phase_label(token), "at": at} for token, at in phases],
        "calls": int(fields["calls"]) if fields.get("calls", "").isdigit() else None,
        "tokens": int(fields["tokens"]) if fields.get("tokens", "").isdigit() else None,
        "cost": fields.get("cost") or None,
        "updated": fields.get("updated") or None,
        "forge": fields.get("forge", ""),
        "delivery": fields.get("delivery", ""),
        "trigger": int(fields["trigger"]) if fields.get("trigger", "").isdigit() else None,
    }


def _links(progress: dict | None, job_id: str) -> dict:
    """The job's delivery and trigger pages: from its progress while it runs, else from its latest record."""
    from apps.receiver.models import Delivery, Trigger

    forge, delivery_id, trigger_id = ((progress["forge"], progress["delivery"], progress["trigger"]) if progress
                                      else ("", "", None))
    if not delivery_id and trigger_id is None:
        latest = Run.objects.for_job(job_id).values_list("kind", "delivery_id", "trigger_id").last()
        forge, delivery_id, trigger_id = latest or ("", "", None)
    links = {}
    delivery = (Delivery.objects.filter(forge=forge, delivery_id=delivery_id).values_list("pk", flat=True).first()
                if delivery_id else None)
    if delivery is not None:
        links["delivery"] = {"label": delivery_id, "url": reverse("admin:receiver_delivery_change", args=[delivery])}
    if trigger_id is not None and Trigger.objects.filter(pk=trigger_id).exists():
        links["trigger"] = {"label": f"trigger #{trigger_id}",
                            "url": reverse("admin:receiver_trigger_change", args=[trigger_id])}
    return links


def live(job_id: str, user) -> dict:
    """One job now: RQ's word for it beside its latest record, the phases its worker wrote, the gateway's count so
    far, its recorded attempts, and (with capture on and the log permission) its output so far."""
    redis = get_redis()
    state = job_states.job_states(redis, [job_id]).get(job_id) or job_states.JobState("unknown")
    answer = {"job_id": job_id, "state": state.state, "detail": state.detail, "progress": None, "output": None,
              "attempts": [{"attempt": attempt, "outcome": outcome, "reason": reason,
                            "url": reverse("admin:worker_run_change", args=[pk])}
                           for pk, attempt, outcome, reason in Run.objects.for_job(job_id)
                           .values_list("pk", "attempt", "outcome", "reason")],
              "ended": state.state in ENDED_STATES}
    try:
        progress = _progress(redis, job_id)
        if progress["state"]:
            answer["progress"] = progress
        if run_logs.can_view_run_log(user):
            output = redis.get(log_key(job_id))
            answer["output"] = None if output is None else text(output)
    except RedisError as exc:
        answer["detail"] = answer["detail"] or f"Redis unreachable ({type(exc).__name__})"
    answer["links"] = _links(answer["progress"], job_id)
    if state.state == "running" and answer["progress"] and answer["progress"]["state"] == "ended":
        answer["state"] = "recording"  # the record is written, RQ has not marked the job finished yet
    return answer


def running_now(limit: int = 50) -> list[dict]:
    """The jobs a work horse is climbing or running now, oldest first: each with its host, attempt and phase.
    Entries a killed horse left behind drop out by RQ's word for the job (only `running` ones are listed)."""
    redis = get_redis()
    try:
        job_ids = [text(job_id) for job_id in redis.zrange(RUNNING, 0, limit - 1)]
        states = job_states.job_states(redis, job_ids) if job_ids else {}
        rows, gone = [], []
        for job_id in job_ids:
            if states.get(job_id) is None or states[job_id].state != "running":
                if not redis.exists(key(job_id)):
                    gone.append(job_id)  # its horse died before it could say so, and its keys have lapsed
                continue
            progress = _progress(redis, job_id)
            phase = progress["phases"][-1] if progress["phases"] else None
            rows.append({"job_id": job_id, "host": progress["host"], "attempt": progress["attempt"],
                         "phase": phase["label"] if phase else "", "since": phase["at"] if phase else "",
                         "started": progress["phases"][0]["at"] if progress["phases"] else "",
                         "tokens": progress["tokens"],
                         "url": reverse("admin:worker_run_live", args=[job_id])})
        if gone:
            redis.zrem(RUNNING, *gone)
        return rows
    except RedisError:
        return []
