"""The admin's "Start a run" page: a form over manual_runs.py, the one service `dispatch_run` and the API use.

The form only collects text; the service validates it (its refusals land beside the field they name) and
queues the job. "Run now" on a trigger opens this page filled in from the trigger (a schedule's folder and
task, a forge rule's flow), so the operator names the host or the issue and confirms before anything is spent.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from redis.exceptions import RedisError

from apps import forge_registry
from apps.worker.manual_runs import ManualRunRefused, start_cron_trigger_run, start_forge_run, start_local_run
from apps.worker.validators import MIN_TURNS

PERMISSION = "worker.start_run"


class StartRunForm(forms.Form):
    where = forms.ChoiceField(label="Work on", widget=forms.RadioSelect, initial="forge", choices=(
        ("forge", "an issue or pull request on a forge (cloned, then published as a pull request)"),
        ("local", "a folder on a worker host (a git checkout; nothing is published)"),
        ("cron", "a cron trigger, now (its own folder, task, model and limits)")))
    # a folder on a host
    folder = forms.CharField(required=False, label="Folder", help_text="Absolute path on the host, under a root it "
                             "declares (PI_LOCAL_ROOTS), e.g. /srv/code/app")
    host = forms.CharField(required=False, label="Host", help_text="The worker host that holds the folder, e.g. "
                                                                   "hostA. Empty: this host.")
    force = forms.BooleanField(required=False, label="Run even with uncommitted changes")
    # a forge target
    forge = forms.ChoiceField(required=False, label="Forge",
                              choices=[(forge.name, forge.label) for forge in forge_registry.FORGES])
    repository = forms.CharField(required=False, label="Repository", help_text="As the forge names it, e.g. acme/web")
    number = forms.IntegerField(required=False, min_value=1, label="Issue or PR number", help_text="e.g. 42")
    target_type = forms.ChoiceField(required=False, label="It is", initial="issue",
                                    choices=(("issue", "an issue"), ("pull_request", "a pull / merge request")))
    project_id = forms.CharField(required=False, label="Project id", help_text="GitLab: the numeric project id "
                                 "(optional); Azure DevOps: the project's id (required).")
    repository_id = forms.CharField(required=False, label="Repository id", help_text="Azure DevOps only.")
    # a cron trigger, now
    cron_trigger = forms.CharField(required=False, label="Cron trigger", help_text="Its id (on.id), e.g. "
                                   "nightly-deps. It runs as its schedule would: the fields below are not used.")
    cron_host = forms.CharField(required=False, label="Host", help_text="The worker host that holds its folder, e.g. "
                                                                        "hostA. Empty: this host.")
    # what runs
    task = forms.CharField(required=False, label="Task", widget=forms.Textarea(attrs={"rows": 4}),
                           help_text="What the agent should do. Required for a folder; on an issue it is added to "
                                     "the issue's own text. e.g. Upgrade the linter config.")
    flow = forms.CharField(required=False, label="Flow", help_text="A pi skill, e.g. fix-bug. Empty: the task alone.")
    command = forms.CharField(required=False, label="Or a command", help_text="A pi extension command, e.g. triage")
    provider = forms.CharField(required=False, label="Model provider", help_text="Empty: the deployment's, e.g. "
                                                                                 "anthropic")
    model = forms.CharField(required=False, label="Model", help_text="Empty: the deployment's, e.g. claude-sonnet-4-5")
    max_turns = forms.IntegerField(required=False, min_value=MIN_TURNS, label="Max turns",
                                   help_text="Empty: the deployment's, e.g. 20")
    image = forms.CharField(required=False, label="Job image", help_text="Empty: PI_JOB_IMAGE")


def _execution(data: dict) -> dict:
    return {name: data.get(name) or "" for name in ("task", "flow", "command", "image", "provider", "model")} | {
        "max_turns": data.get("max_turns")}


def start(data: dict, user):
    """One call into manual_runs for the form's choice; ManualRunRefused and PermissionDenied as the service raises
    them (a folder takes a permission of its own)."""
    if data.get("where") == "cron":
        return start_cron_trigger_run((data.get("cron_trigger") or "").strip(), by=user,
                                      host=(data.get("cron_host") or "").strip())
    execution = _execution(data)
    if data.get("where") == "local":
        return start_local_run(data.get("folder") or "", by=user, host=(data.get("host") or "").strip(),
                               force=bool(data.get("force")), **execution)
    if data.get("number") is None:
        raise ManualRunRefused("number", "the issue or pull request number, at least 1")
    return start_forge_run(data.get("forge") or "", (data.get("repository") or "").strip(), data["number"],
                           target_type=data.get("target_type") or "issue", project_id=data.get("project_id") or "",
                           repository_id=data.get("repository_id") or "", **execution)


def initial_from_trigger(trigger) -> dict:
    """The form's values for "Run now" on a trigger."""
    values = {"flow": trigger.flow, "command": trigger.command, "image": trigger.image, "provider": trigger.provider,
              "model": trigger.model, "max_turns": trigger.max_turns or ""}
    if trigger.kind == "local":
        values |= {"where": "local", "folder": trigger.folder, "task": trigger.task, "cron_trigger": trigger.cron_id}
    else:
        values |= {"where": "forge", "forge": trigger.kind}
    return {name: value for name, value in values.items() if value not in ("", None)}


def run_now_url(trigger) -> str:
    return reverse("admin:start_run") + "?" + urlencode({**initial_from_trigger(trigger), "trigger": trigger.pk})


def _known_hosts() -> list[str]:
    from apps.fleet import registry
    from apps.fleet.connection import get_redis

    try:
        return sorted(host.name for host in registry.read_hosts(get_redis()) if host.declared)
    except (RedisError, registry.RegistryUnreadable):
        return []


def start_run_view(request):
    from django.contrib import admin

    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied
    if request.method == "POST":
        form = StartRunForm(request.POST)
        if form.is_valid():
            try:
                queued = start(form.cleaned_data, request.user)
            except ManualRunRefused as refused:
                field = {"trigger": "cron_trigger", "host": "cron_host"}.get(refused.field, refused.field) \
                    if form.cleaned_data.get("where") == "cron" else refused.field
                form.add_error(field if field in form.fields else None, refused.message)
            except PermissionDenied as denied:
                form.add_error("where", str(denied))
            else:
                messages.success(request, format_html(
                    'Queued <a href="{}" id="started-job">{}</a> on {} ({}): its runs appear there when it starts; '
                    'the <a href="{}">fleet panel</a> shows it waiting. {}',
                    reverse("admin:worker_run_changelist") + "?" + urlencode({"job_id": queued.job_id}),
                    queued.job_id, queued.target, queued.queue,
                    reverse("admin:fleet_fleetpanel_changelist"), queued.note))
                return redirect(reverse("admin:start_run"))
    else:
        form = StartRunForm(initial={key: value for key, value in request.GET.items()
                                     if key in StartRunForm.base_fields})
    return TemplateResponse(request, "admin/worker/start_run.html", {
        **admin.site.each_context(request), "title": "Start a run", "form": form, "hosts": _known_hosts(),
        "from_trigger": request.GET.get("trigger", ""),
    })
