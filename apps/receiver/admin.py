"""The intake in the admin: triggers (one type at a time, Run now) and the delivery inbox with its jobs' states."""

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, Max, QuerySet
from django.http import HttpRequest
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from apps.fleet import job_states
from apps.fleet.connection import get_redis
from apps.worker import start_run_view
from pidispatch_site import admin_display
from pidispatch_site.admin_mixins import ManagedChangesAdmin

from . import intake, trigger_form, triggers
from .models import Delivery, DeliveryStatus, PollCursor, Trigger


def _attach_job_states(deliveries) -> list[dict]:
    """One Redis round trip and one query for every job of the deliveries shown."""
    ids = [job_id for delivery in deliveries for job_id in (delivery.job_ids or [])]
    found = job_states.job_states(get_redis(), ids) if ids else {}
    for delivery in deliveries:
        delivery.job_states = {job_id: found[job_id] for job_id in (delivery.job_ids or []) if job_id in found}
    return [delivery.job_states for delivery in deliveries]


def _runs_of(job_id: str, state) -> str:
    """One click to the job: its recorded attempts, or, before any is recorded, its live page (queued, then its
    phases while it runs)."""
    if state is not None and state.run_pk is not None:
        return reverse("admin:worker_run_changelist") + "?" + urlencode({"job_id": job_id})
    return reverse("admin:worker_run_live", args=[job_id])


def _short(job_id: str) -> str:
    return job_id if len(job_id) <= admin_display.SHORT_ID_CHARS else f"{job_id[:10]}…{job_id[-10:]}"


class _JobStateChangeList(ChangeList):
    def get_results(self, request):
        super().get_results(request)
        _attach_job_states(self.result_list)


class OneShotStateFilter(admin.SimpleListFilter):
    title = "one-shot"
    parameter_name = "one_shot"

    def lookups(self, request, model_admin):
        return (("armed", "armed"), ("disarmed", "disarmed (spent)"))

    def queryset(self, request, queryset):
        if self.value() == "armed":
            return queryset.filter(once=True, disarmed_at__isnull=True)
        if self.value() == "disarmed":
            return queryset.filter(once=True, disarmed_at__isnull=False)
        return queryset


@admin.register(Trigger)
class TriggerAdmin(ManagedChangesAdmin, admin.ModelAdmin):
    form = trigger_form.TriggerForm
    manage_permission = "receiver.manage_triggers"
    list_display = ("position", "name_display", "kind", "on_type", "repositories", "predicate", "work",
                    "max_cost", "enabled", "last_fired", "run_count", "one_shot_state")
    list_display_links = ("position", "name_display")
    list_editable = ("enabled",)
    list_filter = ("enabled", "kind", "on_type", OneShotStateFilter)
    search_fields = ("name", "flow", "command", "note", "phrase", "cron_id", "repository")
    ordering = ("position", "id")
    readonly_fields = ("one_shot_state", "type_display")
    actions = ("enable_selected", "disable_selected", "rearm_selected", "run_now")

    # --- one trigger type at a time ----------------------------------------------------------------------

    def _type(self, request, obj=None) -> str:
        return (trigger_form.chosen_type(request.POST.get("on_type"))
                or trigger_form.chosen_type(request.GET.get("on_type"))
                or (obj.on_type if obj is not None else ""))

    def get_fieldsets(self, request, obj=None):
        return trigger_form.fieldsets_for(self._type(request, obj) or "label", obj)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        form.chosen_type = self._type(request, obj) or "label"
        form.may_set_skills_dir = triggers.may_set_skills_dir(request.user)
        return form

    def save_model(self, request, obj, form, change):
        before = Trigger.objects.filter(pk=obj.pk).values_list("skills_dir", flat=True).first() if change else ""
        triggers.check_skills_dir_change(request.user, before or "", obj.skills_dir)
        super().save_model(request, obj, form, change)
        for rule, earlier in triggers.never_firing():
            if rule.pk == obj.pk:
                self.message_user(request, triggers.never_fires_sentence(rule, earlier), messages.WARNING)
        for _rule, sentence in triggers.unpriced_models([obj]):
            self.message_user(request, sentence, messages.WARNING)

    def changelist_view(self, request, extra_context=None):
        if request.method == "GET":
            for rule, earlier in triggers.never_firing():
                messages.warning(request, triggers.never_fires_sentence(rule, earlier))
            for rule, sentence in triggers.unpriced_models():
                messages.warning(request, f"trigger “{rule}”: {sentence}")
        return super().changelist_view(request, extra_context)

    def get_changeform_initial_data(self, request):
        initial = super().get_changeform_initial_data(request)
        return {**initial, "on_type": self._type(request) or "label"}

    def add_view(self, request, form_url="", extra_context=None):
        if request.method == "GET" and not self._type(request) and self.has_add_permission(request):
            return self._choose_type(request, None)
        return super().add_view(request, form_url, extra_context)

    def _choose_type(self, request, obj):
        return TemplateResponse(request, "admin/receiver/trigger/choose_type.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "original": obj,
            "title": "Which kind of trigger?" if obj is None else f"Change the type of {obj}",
            "types": [(value, *words) for value, words in trigger_form.TYPES.items()],
        })

    @admin.display(description="Trigger type")
    def type_display(self, trigger: Trigger) -> str:
        # The type decides which fields exist; it is chosen first, and changing it is a step of its own.
        value = trigger.on_type
        name, fires = trigger_form.TYPES.get(value, (value, ""))
        return format_html('<strong>{}</strong>: {} <a href="?choose_type=1" class="change-type">Change type</a>',
                           name, fires) if trigger.pk else format_html(
            '<strong>{}</strong>: {} <a href="./" class="change-type">Change type</a>', name, fires)

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(run_total=Count("runs"), last_run_at=Max("runs__started_at"))

    @admin.display(description="name", ordering="name")
    def name_display(self, trigger: Trigger) -> str:
        if trigger.name:
            return trigger.name
        return f"{trigger_form.TYPES.get(trigger.on_type, (trigger.on_type,))[0]} #{trigger.position}"

    @admin.display(description="repositories")
    def repositories(self, trigger: Trigger) -> str:
        """Where it applies: a schedule's folder, an Azure work item rule's repository, else the forge's every
        repository that sends it hooks (or that the GitHub poller reads)."""
        if trigger.kind == "local":
            return trigger.folder or "-"
        if trigger.repository:
            return f"{trigger.repository} (in the work item's project)"
        return "every repository"

    @admin.display(description="max cost", ordering="max_cost_usd")
    def max_cost(self, trigger: Trigger) -> str:
        return admin_display.money(trigger.max_cost_usd) if trigger.max_cost_usd is not None else "the deployment's"

    @admin.display(description="last fired", ordering="last_run_at")
    def last_fired(self, trigger: Trigger) -> str:
        return admin_display.instant(trigger.last_run_at) if trigger.last_run_at else "never"

    @admin.display(description="fires on")
    def predicate(self, trigger: Trigger) -> str:
        if trigger.on_type == "cron":
            return f"{trigger.cron_id}: {trigger.cron_pattern}"
        if trigger.on_type == "comment":
            return f"comment containing {trigger.phrase!r}"
        parts = [", ".join(map(str, trigger.actions))] if trigger.actions else []
        for word, names in (("any", trigger.label_any), ("all", trigger.label_all), ("none", trigger.label_none)):
            if names:
                parts.append(f"{word}: {', '.join(map(str, names))}")
        if trigger.number is not None:
            parts.append(f"#{trigger.number}")
        return "; ".join(parts) or "-"

    @admin.display(description="flow")
    def work(self, trigger: Trigger) -> str:
        target = f"local {trigger.folder.rstrip('/').rsplit('/', 1)[-1]}/" if trigger.kind == "local" else ""
        work = trigger.flow or f"/{trigger.command}"
        return f"{target}{work}" + (f" ×{trigger.replicas}" if trigger.replicas else "")

    @admin.display(description="one-shot")
    def one_shot_state(self, trigger: Trigger) -> str:
        if not trigger.once:
            return "-"
        if trigger.disarmed_at is None:
            return "armed"
        return format_html("disarmed {} by job {} (re-arm with the action “Re-arm…”)",
                           trigger.disarmed_at.strftime("%Y-%m-%d %H:%M:%S UTC"), trigger.disarmed_job_id or "-")

    @admin.display(description="runs", ordering="run_total")
    def run_count(self, trigger: Trigger) -> str:
        if not trigger.run_total:
            return "0"
        url = reverse("admin:worker_run_changelist") + "?" + urlencode({"trigger__id__exact": trigger.pk})
        return format_html('<a href="{}">{}</a>', url, trigger.run_total)

    @admin.action(description="Run now… (one trigger: confirm its target, then start it)", permissions=["start_run"])
    def run_now(self, request: HttpRequest, queryset: QuerySet):
        # A trigger has no target of its own (no issue, no host): the Start a run page takes it from here,
        # filled in, and starts it through manual_runs once the operator names where.
        if queryset.count() != 1:
            self.message_user(request, "Select one trigger to run now; nothing was started.", messages.WARNING)
            return None
        return redirect(start_run_view.run_now_url(queryset.get()))

    def has_start_run_permission(self, request) -> bool:
        return request.user.has_perm(start_run_view.PERMISSION)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if request.method == "GET" and request.GET.get("choose_type") and self.has_change_permission(request):
            return self._choose_type(request, self.get_object(request, object_id))
        trigger = self.get_object(request, object_id)
        extra = {"run_now_url": start_run_view.run_now_url(trigger)
                 if trigger is not None and self.has_start_run_permission(request) else ""}
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    @admin.action(description="Enable selected triggers", permissions=["change"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet):
        count = triggers.set_enabled(queryset, True)
        self.message_user(request, f"{count} trigger(s) enabled.", messages.SUCCESS)

    @admin.action(description="Disable selected triggers", permissions=["change"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet):
        count = triggers.set_enabled(queryset, False)
        self.message_user(request, f"{count} trigger(s) disabled.", messages.SUCCESS)

    @admin.action(description="Re-arm selected spent one-shot rules", permissions=["change"])
    def rearm_selected(self, request: HttpRequest, queryset: QuerySet):
        count = triggers.rearm(queryset)
        if count:
            self.message_user(request, f"{count} one-shot rule(s) re-armed: each fires again on its next close.",
                              messages.SUCCESS)
        else:
            self.message_user(request, "None of the selected rules is a spent one-shot; nothing changed.",
                              messages.WARNING)


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    """The inbox. Rows carry ids and outcomes only; the payload is held just until the delivery settles."""

    list_display = ("delivery_id", "forge", "event", "status_display", "reason", "jobs", "attempts", "received",
                    "next_attempt")
    list_filter = ("status", "forge", "event", "received_at")
    search_fields = ("delivery_id", "job_ids")
    date_hierarchy = "received_at"
    show_full_result_count = False
    readonly_fields = ("forge", "delivery_id", "event", "status", "status_display", "reason", "jobs", "job_ids",
                       "received_at",
                       "processed_at", "attempts", "attempted_at", "next_attempt_at", "holds_payload")
    exclude = ("payload",)
    actions = ("replay_selected", "discard_selected")

    class Media:
        css = {"all": ("worker/admin.css",)}  # the jobs' state colours, as on the runs list

    def get_changelist(self, request, **kwargs):
        return _JobStateChangeList

    def get_object(self, request, object_id, from_field=None):
        delivery = super().get_object(request, object_id, from_field)
        if delivery is not None:
            _attach_job_states([delivery])
        return delivery

    @admin.display(description="status now", ordering="status")
    def status_display(self, delivery: Delivery) -> str:
        """Intake's status, followed by its jobs' while they are on their way and once they end: the row is never
        rewritten for it (its status is intake's, which housekeeping and replay go by); the state is read from the
        jobs (RQ and their run records) each time it is shown."""
        if delivery.status != DeliveryStatus.QUEUED or not delivery.job_ids:
            return delivery.get_status_display()
        states = getattr(delivery, "job_states", None)
        if states is None:
            states = _attach_job_states([delivery])[0]
        word = job_states.overall(states, delivery.job_ids)
        return format_html('queued → <span class="outcome outcome-{}">{}</span>', word, word)

    @admin.display(description="jobs now")
    def jobs(self, delivery: Delivery) -> str:
        """Each job's latest state (queue or run record), linked to its runs: intake's "queued" is not the end."""
        states = getattr(delivery, "job_states", None)
        if states is None:
            states = _attach_job_states([delivery])[0]
        if not delivery.job_ids:
            return "-"
        return format_html_join(mark_safe("<br>"), '<a href="{}" class="job-state state-{}" title="{}">{} · {}</a>', (
            (_runs_of(job_id, states.get(job_id)), state.state, job_id, _short(job_id),
             f"{state.state}{f' ({state.detail})' if state.detail else ''}")
            for job_id in delivery.job_ids for state in [states.get(job_id) or job_states.JobState("unknown")]))

    @admin.display(description="received", ordering="received_at")
    def received(self, delivery: Delivery) -> str:
        return admin_display.instant(delivery.received_at)

    @admin.display(description="next attempt", ordering="next_attempt_at")
    def next_attempt(self, delivery: Delivery) -> str:
        return admin_display.instant(delivery.next_attempt_at) if delivery.next_attempt_at else "-"

    @admin.display(boolean=True, description="payload held")
    def holds_payload(self, delivery: Delivery) -> bool:
        return delivery.payload is not None

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_inbox_permission(self, request) -> bool:
        return request.user.has_perm("receiver.change_delivery")

    @admin.action(description="Replay selected deliveries now", permissions=["inbox"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet):
        outcomes: dict[str, int] = {}
        skipped = 0
        for delivery in queryset.replay_order():
            answer = intake.replay(delivery)
            if answer is None:
                skipped += 1
                continue
            outcomes[answer.outcome] = outcomes.get(answer.outcome, 0) + 1
        summary = ", ".join(f"{count} {'still pending' if outcome == 'accepted' else outcome}"
                            for outcome, count in sorted(outcomes.items()))
        if summary:
            level = messages.WARNING if "accepted" in outcomes else messages.SUCCESS
            self.message_user(request, f"Replayed {sum(outcomes.values())} delivery(ies): {summary}.", level)
        if skipped:
            self.message_user(request, f"{skipped} delivery(ies) skipped: already settled (no payload kept) or "
                                       "being processed right now.", messages.INFO)

    @admin.action(description="Discard selected pending deliveries", permissions=["inbox"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet):
        discarded = sum(intake.discard(delivery) for delivery in queryset.filter(
            status__in=(DeliveryStatus.PENDING, DeliveryStatus.RECEIVED)))
        if discarded:
            self.message_user(request, f"{discarded} delivery(ies) discarded; their payloads are deleted.",
                              messages.SUCCESS)
        else:
            self.message_user(request, "Only pending deliveries can be discarded; nothing changed.", messages.WARNING)


@admin.register(PollCursor)
class PollCursorAdmin(admin.ModelAdmin):
    """Where the GitHub poller is in each repository (apps/receiver/polling/): shown, never edited. Deleting a row
    arms its repository afresh at the next poll: what is there by then starts nothing."""

    list_display = ("repo", "armed_display", "polled_display", "events_id", "comments_id", "open_pulls")
    search_fields = ("repo",)
    readonly_fields = ("repo", "armed_at", "polled_at", "events_id", "comments_since", "comments_id", "pulls", "etags")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="armed", ordering="armed_at")
    def armed_display(self, cursor: PollCursor) -> str:
        return admin_display.instant(cursor.armed_at)

    @admin.display(description="last polled", ordering="polled_at")
    def polled_display(self, cursor: PollCursor) -> str:
        return admin_display.instant(cursor.polled_at)

    @admin.display(description="open pull requests")
    def open_pulls(self, cursor: PollCursor) -> int:
        return sum(1 for state in (cursor.pulls or {}).values() if state != "closed")
