"""Starting a run by hand: the one service `dispatch_run`, the API's `POST /api/v1/runs` and the admin's
"Start a run" page call.

    queued = start_local_run("/srv/code/app", task="Upgrade the linter config", host="hostA")
    queued = start_forge_run("github", "acme/web", 7, flow="fix-bug", task="Look at the footer too.")
    queued = start_cron_trigger_run("nightly-deps", by=request.user)  # a cron trigger, now
    queued.job_id, queued.queue

A local run names a folder on a worker host, whose files the agent may then rewrite: starting one takes the
permission `worker.start_folder_run` (checked here for the user who asks; None is a command run on the host, whose
shell holds its files already). On this host the folder is checked now (outside the host's PI_LOCAL_ROOTS, a dirty
tree or a missing folder is refused here, with what to do); on another host its own worker checks it at gate 10,
as it does every local job's. A forge run names an issue or pull request; the worker resolves, clones and publishes
it as it does a webhook's job. Every refusal is `ManualRunRefused(field, message)`, the message fit for a form, a
400 or a CLI error (a folder's refusal also carries its reason token, and never the folder's real path).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.utils import timezone
from redis.exceptions import RedisError

from apps.fleet.hosts import HOST_NAME_PATTERN, this_host
from apps.fleet.queues import SHARED_QUEUE, host_queue
from apps.fleet.routing import host_affine_queue
from apps.worker import known_models, validators
from apps.worker.forges import forge_client
from apps.worker.jobs import FORGE_KINDS, JobSpec, enqueue
from apps.worker.name_patterns import FLOW_PATTERN, IMAGE_PATTERN, MODEL_PATTERN, PROVIDER_PATTERN
from apps.worker.sandbox.workspace import WorkspaceRefused, check_local_folder

logger = logging.getLogger("pidispatch.manual_runs")

MAX_TASK_CHARS = 100_000
COMMAND_PATTERN = FLOW_PATTERN
FOLDER_PERMISSION = "worker.start_folder_run"


class ManualRunRefused(Exception):
    def __init__(self, field: str, message: str, reason: str = ""):
        super().__init__(message)
        self.field = field
        self.message = message
        self.reason = reason  # the workspace's refusal token, when the folder was refused


@dataclass(frozen=True)
class QueuedRun:
    job_id: str
    queue: str
    target: str
    note: str = ""  # what the person starting it should know (an undeclared host, say)


def _execution(flow: str, command: str, image: str, provider: str, model: str, max_turns: int | None) -> dict:
    if flow and command:
        raise ManualRunRefused("flow", "give a flow or a command, not both")
    if flow and not FLOW_PATTERN.fullmatch(flow):
        raise ManualRunRefused("flow", f"{flow!r}: use 1-64 lowercase letters, digits, '-' or '_' (e.g. fix-bug)")
    if command and not COMMAND_PATTERN.fullmatch(command):
        raise ManualRunRefused("command", f"{command!r}: use 1-64 lowercase letters, digits, '-' or '_'")
    if image and not IMAGE_PATTERN.fullmatch(image):
        raise ManualRunRefused("image", f"{image!r} is not an image reference (e.g. pi-job:latest)")
    if provider and not PROVIDER_PATTERN.fullmatch(provider):
        raise ManualRunRefused("provider", f"{provider!r} is not a provider name (e.g. anthropic)")
    if model and not MODEL_PATTERN.fullmatch(model):
        raise ManualRunRefused("model", f"{model!r} is not a model name (e.g. claude-sonnet-4-5)")
    if model and (problem := known_models.refusal(provider or settings.PI_PROVIDER, model)):
        raise ManualRunRefused("model", problem)
    if validators.turns_problem(max_turns):
        raise ManualRunRefused("max_turns", validators.TURNS_RULE)
    return {"flow": flow if flow or command else "task", "command": command, "image": image, "provider": provider,
            "model": model, "max_turns": max_turns}


def _task(task: str, required: bool) -> str:
    if not isinstance(task, str):
        raise ManualRunRefused("task", "must be text")
    if required and not task.strip():
        raise ManualRunRefused("task", "is empty: say what the agent should do")
    if len(task) > MAX_TASK_CHARS:
        raise ManualRunRefused("task", f"is longer than {MAX_TASK_CHARS} characters")
    return task


def _enqueue(spec: JobSpec, queue: str) -> None:
    try:
        enqueue(spec, queue)
    except RedisError:
        raise ManualRunRefused("", "Redis did not answer (REDIS_URL); nothing was queued. Start Redis and retry.") \
            from None


def may_start_folder_runs(user) -> bool:
    return bool(user and user.is_active and user.has_perm(FOLDER_PERMISSION))


def start_local_run(folder: str, *, by, task: str, host: str = "", flow: str = "", command: str = "",
                    image: str = "", provider: str = "", model: str = "", max_turns: int | None = None,
                    force: bool = False) -> QueuedRun:
    """A run on a local git folder of a worker host (this one when `host` is empty or names this host), started by
    the user `by` (PermissionDenied without `worker.start_folder_run`), or by a command on the host (None)."""
    if by is not None and not may_start_folder_runs(by):
        raise PermissionDenied(f"starting a run on a folder needs the permission {FOLDER_PERMISSION}")
    here = this_host()
    if host and not HOST_NAME_PATTERN.fullmatch(host):
        raise ManualRunRefused("host", f"{host!r} is not a host name (letters, digits, '.', '_' or '-')")
    if not isinstance(folder, str) or not folder.strip():
        raise ManualRunRefused("folder", "name the folder: an absolute path on the worker host")
    local = not host or host == here.name
    if local:
        path = str(Path(folder).expanduser().resolve())
        try:
            check_local_folder(path, force=force)
        except WorkspaceRefused as refused:
            logger.info("manual_run_folder_refused folder=%r reason=%s", path, refused.reason)
            hint = " Commit or stash them, or run it forced." if refused.reason == "workspace-dirty" else ""
            raise ManualRunRefused("folder", f"{refused.hint[:1].upper()}{refused.hint[1:]}.{hint}",
                                   refused.reason) from None
    else:
        if not folder.startswith("/"):
            raise ManualRunRefused("folder", "a folder on another host is named by its absolute path")
        path = folder
    execution = _execution(flow, command, image, provider, model, max_turns)
    spec = JobSpec(job_id=f"run-{uuid.uuid4().hex}", kind="local", folder=path, target_type="local",
                   task=_task(task, required=True), force=force, **execution)
    if local:
        queue = host_queue(here.name) if here.declared else SHARED_QUEUE
    else:
        queue = host_queue(host)
    _enqueue(spec, queue)
    note = "" if not local or here.declared else (
        "this host has no PI_WORKER_NAME, so the job waits on the shared queue and any worker may take it; "
        "declare PI_WORKER_NAME on hosts that hold local folders.")
    return QueuedRun(job_id=spec.job_id, queue=queue, target=spec.target, note=note)


def start_cron_trigger_run(cron_id: str, *, by, host: str = "") -> QueuedRun:
    """Fire a cron trigger once now, with its own fields (the ancestor's `run --trigger <cronId>`): on this host
    when `host` is empty or names it (the trigger's folder must be here), else on `host`'s queue for its worker to
    check. Started twice in one minute it is one job (`manual-<trigger id>-<minute>`; the note says so). Its folder
    is held to what its schedule's runs are (a git checkout, no uncommitted changes). Like a folder run, it takes
    `worker.start_folder_run` for a user."""
    from apps.receiver.cron import cron_job_spec
    from apps.receiver.models import Trigger, TriggerType
    from apps.receiver.validation import CRON_ID_PATTERN

    if by is not None and not may_start_folder_runs(by):
        raise PermissionDenied(f"running a cron trigger's folder needs the permission {FOLDER_PERMISSION}")
    if not isinstance(cron_id, str) or not CRON_ID_PATTERN.fullmatch(cron_id):
        raise ManualRunRefused("trigger", f"{cron_id!r} is not a cron trigger id (its on.id: 1-64 letters, digits, "
                                          "'.', '_' or '-')")
    trigger = Trigger.objects.filter(on_type=TriggerType.CRON, cron_id=cron_id).first()
    if trigger is None:
        raise ManualRunRefused("trigger", f"no cron trigger has the id {cron_id!r} (Intake › Triggers lists them)")
    if host and not HOST_NAME_PATTERN.fullmatch(host):
        raise ManualRunRefused("host", f"{host!r} is not a host name (letters, digits, '.', '_' or '-')")
    here = this_host()
    local = not host or host == here.name
    if local:
        try:
            check_local_folder(trigger.folder, force=False)
        except WorkspaceRefused as refused:
            logger.info("manual_run_folder_refused trigger=%s reason=%s", trigger.pk, refused.reason)
            raise ManualRunRefused("trigger", f"cron trigger {cron_id!r} cannot run on this host: its folder: "
                                              f"{refused.hint}. Run it on the host that holds its folder.",
                                   refused.reason) from None
    now = timezone.now().replace(second=0, microsecond=0)
    spec = cron_job_spec(trigger, now, job_id=f"manual-{trigger.pk}-{int(now.timestamp())}")
    queue = host_affine_queue(here) if local else host_queue(host)
    try:
        created = enqueue(spec, queue).created
    except RedisError:
        raise ManualRunRefused("", "Redis did not answer (REDIS_URL); nothing was queued. Start Redis and retry.") \
            from None
    note = "" if created else "it was already started this minute: that run is the one (nothing new was queued)."
    if created and local and not here.declared:
        note = ("this host has no PI_WORKER_NAME, so the job waits on the shared queue and any worker may take it; "
                "declare PI_WORKER_NAME on hosts that hold local folders.")
    return QueuedRun(job_id=spec.job_id, queue=queue, target=spec.target, note=note)


def start_forge_run(forge: str, repository: str, number: int, *, target_type: str = "issue", task: str = "",
                    flow: str = "", command: str = "", image: str = "", provider: str = "", model: str = "",
                    max_turns: int | None = None, project_id: str = "", repository_id: str = "") -> QueuedRun:
    """A run on a forge's issue or pull request, as if a trigger had fired on it (cloned, published)."""
    if forge not in FORGE_KINDS:
        raise ManualRunRefused("forge", f"{forge!r}: one of {', '.join(FORGE_KINDS)}")
    client = forge_client(forge)
    if not client.base_url or not (client.token or getattr(client, "app", None)):
        raise ManualRunRefused("forge", f"this deployment has no {forge} credential its workers could act with")
    if not isinstance(repository, str) or not repository.strip() or len(repository) > 300 or any(
            ch.isspace() for ch in repository):
        raise ManualRunRefused("repository", "the repository as the forge names it (e.g. acme/web)")
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ManualRunRefused("number", "the issue or pull request number, at least 1")
    if target_type not in ("issue", "pull_request"):
        raise ManualRunRefused("target_type", "issue or pull_request")
    if forge == "gitlab" and project_id and not project_id.isdigit():
        raise ManualRunRefused("project_id", "GitLab's numeric project id")
    if forge == "azure" and not (project_id and repository_id):
        raise ManualRunRefused("project_id", "Azure DevOps needs the project and repository ids")
    execution = _execution(flow, command, image, provider, model, max_turns)
    spec = JobSpec(job_id=f"run-{uuid.uuid4().hex}", kind=forge, repo=repository.strip(), number=number,
                   target_type=target_type, task=_task(task, required=False), project_id=project_id,
                   repository_id=repository_id, trigger_type="manual", **execution)
    _enqueue(spec, SHARED_QUEUE)
    return QueuedRun(job_id=spec.job_id, queue=SHARED_QUEUE, target=spec.target)
