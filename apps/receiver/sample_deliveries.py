"""Sample deliveries for trying a deployment out (`manage.py send_delivery`): one real payload per forge and event
the matcher knows (the shapes of tests/payloads/, the corpus's where it has them), given a label, a number or a
comment, and signed or authenticated exactly as that forge does it, with this deployment's own webhook secret.

    sample = build("gitlab", "merge_request", label="pi")
    answer = post(sample, "http://127.0.0.1:8000")    # (status, the receiver's JSON answer)
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from apps import forge_registry
from apps.receiver import forge_config

PAYLOADS = Path(settings.BASE_DIR) / "tests" / "payloads"

# (forge, event) -> the payload file under tests/payloads/. The event is what the matcher reads: GitHub's and
# Forgejo's event header, GitLab's object_kind, Azure DevOps' eventType.
SAMPLES = {
    ("github", "issues"): "github/issues_labeled.json",
    ("github", "issue_comment"): "github/issue_comment_created.json",
    ("github", "pull_request"): "github/pull_request_opened.json",
    ("github", "pull_request_review"): "github/pull_request_review_submitted.json",
    ("gitlab", "issue"): "gitlab/issue_update_labels.json",
    ("gitlab", "merge_request"): "gitlab/merge_request_update_labels.json",
    ("gitlab", "note"): "corpus/gitlab/note_hook__issue_note.json",
    ("forgejo", "issues"): "forgejo/issues_label_updated.json",
    ("forgejo", "pull_request"): "forgejo/pull_request_label_updated.json",
    ("forgejo", "issue_comment"): "corpus/gitea/issue_comment__new.json",
    ("azure", "workitem.updated"): "azure/workitem_updated_tags.json",
    ("azure", "workitem.commented"): "azure/workitem_commented.json",
    ("azure", "git.pullrequest.created"): "corpus/azure/code_pull_request__opened.json",
    ("azure", "ms.vss-code.git-pullrequest-comment-event"): "azure/pullrequest_comment.json",
}
GITLAB_HEADERS = {"issue": "Issue Hook", "merge_request": "Merge Request Hook", "note": "Note Hook"}
# The names a person tries first, the same on every forge: each forge's own event for them.
COMMON_EVENTS = {
    "issue": {"github": "issues", "gitlab": "issue", "forgejo": "issues", "azure": "workitem.updated"},
    "pull_request": {"github": "pull_request", "gitlab": "merge_request", "forgejo": "pull_request",
                     "azure": "git.pullrequest.created"},
    "comment": {"github": "issue_comment", "gitlab": "note", "forgejo": "issue_comment",
                "azure": "workitem.commented"},
}
COMMON_EVENTS["issues"] = COMMON_EVENTS["issue"]
COMMON_EVENTS["merge_request"] = COMMON_EVENTS["pull_request"]


class SampleError(ValueError):
    """A forge, event or option the samples cannot serve; the message says what would."""


@dataclass(frozen=True)
class Sample:
    forge: str
    event: str
    delivery_id: str
    number: int
    body: bytes
    headers: dict


def events_of(forge: str) -> list[str]:
    return [event for name, event in SAMPLES if name == forge]


def event_of(forge: str, event: str | None) -> str:
    """The forge's own event name: its first sample's when None, a common name (issue, pull_request, comment)
    mapped to the forge's. SampleError names the choices."""
    if event is None:
        return events_of(forge)[0]
    if (forge, event) in SAMPLES:
        return event
    if event in COMMON_EVENTS:
        return COMMON_EVENTS[event][forge]
    raise SampleError(f"no sample of {forge} event {event!r}: one of {', '.join(events_of(forge))} (or issue, "
                      "pull_request, comment)")


def build(forge: str, event: str | None = None, *, label: str = "pi", number: int | None = None,
          comment: str = "", repository: str = "") -> Sample:
    """A signed sample delivery of `event` (the forge's first when None): the issue, merge request or work item
    `number` (a new random one by default: the same target triggered again soon is a duplicate) labelled `label`
    (its only label change), or, for a comment event, the comment `comment`. `repository` (owner/name, the GitLab
    project's path, Azure's project) replaces the sample's."""
    forge_registry.get(forge)  # a clear error for an unknown forge
    event = event_of(forge, event)
    config = getattr(forge_config.forge_settings(), forge)
    if config is None:
        raise SampleError(f"{forge} is not configured on this deployment (no webhook secret): its deliveries would be "
                          "refused. See the README's settings table.")
    try:
        payload = json.loads((PAYLOADS / SAMPLES[(forge, event)]).read_text())
    except FileNotFoundError:
        raise SampleError(f"the sample payloads come from the checkout's tests/payloads/, and {PAYLOADS} has no "
                          f"{SAMPLES[(forge, event)]}: run it from a checkout") from None
    number = number or secrets.randbelow(90000) + 10000
    delivery_id = f"sample-{uuid.uuid4()}"
    FILL[forge](payload, event, label, number, comment, repository, delivery_id)
    body = json.dumps(payload).encode()
    return Sample(forge, event, delivery_id, number, body, _headers(forge, event, config, body, delivery_id))


def post(sample: Sample, base_url: str, timeout: float = 30) -> tuple[int, dict]:
    """POST it to the deployment at `base_url`: the HTTP status and the receiver's JSON answer."""
    request = urllib.request.Request(f"{base_url.rstrip('/')}/hooks/{sample.forge}", data=sample.body, method="POST",
                                     headers={"Content-Type": "application/json", **sample.headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, _json(response.read())
    except urllib.error.HTTPError as error:
        return error.code, _json(error.read())


def describe(status: int, answer: dict) -> str:
    """What became of the delivery, in one line."""
    jobs = ", ".join(answer.get("jobs") or [])
    state = answer.get("status") or answer.get("error") or "unknown"
    if state in ("queued", "duplicate") and jobs:
        return f"{state}: {jobs}" + (f" (swallowed by {answer['rule']})" if answer.get("rule") else "")
    if state == "ignored":
        return f"ignored: {answer.get('reason') or 'no reason given'}"
    reason = f": {answer['reason']}" if answer.get("reason") else ""
    return f"{state}{reason} (HTTP {status})"


def job_state(job_id: str, base_url: str) -> tuple[str, bool]:
    """One line on where a queued job is now, and whether that is its end: its run's outcome and the run's page
    (and its pull request), or why it waits (a paused queue, a deferral and until when), queued or running."""
    from rq.exceptions import NoSuchJobError
    from rq.job import Job, JobStatus

    from apps.fleet import pauses, waiting
    from apps.fleet.connection import get_redis, text
    from apps.worker.models import Run

    redis = get_redis()
    try:
        job = Job.fetch(job_id, connection=redis)
        status = job.get_status(refresh=False)
    except NoSuchJobError:
        job, status = None, None
    pending = status in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.STARTED, JobStatus.DEFERRED)
    run = Run.objects.filter(job_id=job_id).order_by("-attempt").first()
    if run is not None and not pending:
        page = f"{base_url.rstrip('/')}/admin/worker/run/{run.pk}/change/"
        what = run.outcome + (f" ({run.reason})" if run.reason else "")
        if run.publish_outcome:
            what += f", {run.publish_outcome}" + (f" {run.publish_url}" if run.publish_url else "")
        return f"{job_id}: {what}: {page}", True
    if status == JobStatus.SCHEDULED:
        note = {text(k): text(v) for k, v in redis.hgetall(waiting.note_key(job_id)).items()}
        reason = note.get("reason") or (f"a retry after {run.reason}" if run is not None else "a retry")
        until = ""
        with contextlib.suppress(ValueError, TypeError):
            until = " until " + datetime.fromtimestamp(float(note["until"]), UTC).strftime("%H:%M:%S UTC")
        return f"{job_id}: waiting ({reason}){until}", False
    if status == JobStatus.QUEUED and job.origin in pauses.read_flags(redis):
        return f"{job_id}: waiting (queue {job.origin} is paused: resume it on the fleet panel)", False
    if status == JobStatus.STARTED:
        return f"{job_id}: running", False
    if status is None and run is None:
        return f"{job_id}: gone from the queue without a run (cancelled or discarded)", True
    return f"{job_id}: queued (no worker has taken it yet: is one running?)", False


def _json(raw: bytes) -> dict:
    try:
        answer = json.loads(raw or b"{}")
    except ValueError:
        return {"error": "not-json"}
    return answer if isinstance(answer, dict) else {"error": "not-an-object"}


# --- each forge's payload, given the label, number and comment ---

def _github(payload, event, label, number, comment, repository, delivery_id):
    item = payload["pull_request"] if event in ("pull_request", "pull_request_review") else payload["issue"]
    item["number"] = number
    if event in ("issues", "pull_request"):
        payload["action"] = "labeled"
        item["labels"] = [{"id": 1, "name": label, "color": "ededed"}]
        payload["label"] = {"id": 1, "name": label, "color": "ededed"}
    if comment and "comment" in payload:
        payload["comment"]["body"] = comment
    if repository:
        payload["repository"]["full_name"] = repository
        payload["repository"]["name"] = repository.rpartition("/")[2]


def _gitlab(payload, event, label, number, comment, repository, delivery_id):
    attrs = payload["object_attributes"]
    if event == "note":
        payload["issue"]["iid"] = number
        attrs["note"] = comment or attrs.get("note") or ""
    else:
        attrs["iid"] = number
        attrs["action"] = "update"
        labels = [{"id": 1, "title": label, "color": "#0e8a16", "type": "ProjectLabel"}]
        attrs["labels"] = payload["labels"] = labels
        payload.setdefault("changes", {})["labels"] = {"previous": [], "current": labels}
    if repository:
        payload["project"]["path_with_namespace"] = repository


def _forgejo(payload, event, label, number, comment, repository, delivery_id):
    item = payload["pull_request"] if event == "pull_request" else payload["issue"]
    item["number"] = payload["number"] = number
    if event == "issue_comment":
        payload["action"] = "created"
        payload["comment"]["body"] = comment or payload["comment"].get("body") or ""
    else:
        payload["action"] = "label_updated"
        item["labels"] = [{"id": 1, "name": label, "color": "0e8a16"}]
    if repository:
        payload["repository"]["full_name"] = repository


def _azure(payload, event, label, number, comment, repository, delivery_id):
    payload["id"] = delivery_id  # Azure DevOps names the delivery in its body
    resource = payload["resource"]
    if event.startswith("workitem."):
        resource["workItemId"] = number
        fields = resource.setdefault("revision", {}).setdefault("fields", {})
        if event == "workitem.updated":
            resource.setdefault("fields", {})["System.Tags"] = {"oldValue": "", "newValue": label}
            fields["System.Tags"] = label
        if comment:
            fields["System.History"] = comment
        if repository:
            fields["System.TeamProject"] = repository
    else:
        pull = resource.get("pullRequest", resource)
        pull["pullRequestId"] = number
        if comment and "comment" in resource:
            resource["comment"]["content"] = comment


FILL = {"github": _github, "gitlab": _gitlab, "forgejo": _forgejo, "azure": _azure}


def _headers(forge: str, event: str, config, body: bytes, delivery_id: str) -> dict:
    if forge == "github":
        digest = hmac.new(settings.GITHUB_WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
        return {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery_id, "X-Hub-Signature-256": f"sha256={digest}"}
    if forge == "gitlab":
        headers = {"X-Gitlab-Event": GITLAB_HEADERS[event], "Idempotency-Key": delivery_id}
        if config.mode == "signature":  # Standard Webhooks, as GitLab 19+ signs
            timestamp = str(int(time.time()))
            signed = f"{delivery_id}.{timestamp}.".encode() + body
            signature = base64.b64encode(hmac.new(config.signing_key, signed, hashlib.sha256).digest()).decode()
            return {**headers, "webhook-id": delivery_id, "webhook-timestamp": timestamp,
                    "webhook-signature": f"v1,{signature}"}
        return {**headers, "X-Gitlab-Token": config.token_secret.decode()}
    if forge == "forgejo":
        digest = hmac.new(config.webhook_secret, body, hashlib.sha256).hexdigest()
        return {"X-Forgejo-Event": event, "X-Forgejo-Delivery": delivery_id, "X-Forgejo-Signature": digest,
                "X-Gitea-Event": event, "X-Gitea-Delivery": delivery_id, "X-Gitea-Signature": digest}
    if config.mode == "basic":
        return {"Authorization": f"Basic {config.credential.decode()}"}
    return {config.header: config.credential.decode()}
