from django import forms
from django.contrib import admin, messages
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from pidispatch_site.admin_mixins import ManagedChangesAdmin

from . import intake, triggers
from .models import Delivery, DeliveryStatus, Trigger


class TriggerForm(forms.ModelForm):
    class Meta:
        model = Trigger
        fields = "__all__"

    def _update_errors(self, errors):
        # Validation speaks about every field of a rule; a field the form does not show (the disarm mark)
        # gets its message at the top of the form instead of an error about a missing field.
        if hasattr(errors, "error_dict"):
            placed: dict = {}
            for field, messages_ in errors.error_dict.items():
                placed.setdefault(field if field in self.fields else NON_FIELD_ERRORS, []).extend(messages_)
            errors = ValidationError(placed)
        super()._update_errors(errors)


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
    form = TriggerForm
    manage_permission = "receiver.manage_triggers"
    list_display = ("position", "kind", "on_type", "predicate", "work", "one_shot_state", "run_count", "enabled",
                    "note")
    list_display_links = ("position", "predicate")
    list_editable = ("enabled",)
    list_filter = ("enabled", "kind", "on_type", OneShotStateFilter)
    search_fields = ("flow", "command", "note", "phrase", "cron_id", "repository")
    ordering = ("position", "id")
    readonly_fields = ("one_shot_state",)
    actions = ("enable_selected", "disable_selected", "rearm_selected")
    fieldsets = (
        (None, {"fields": ("position", "enabled", "note")}),
        ("on: what fires it", {"fields": (
            "on_type", ("cron_id", "cron_pattern"), "label_any", "label_all", "label_none", "phrase", "actions",
            "review_states", ("number", "once"), "one_shot_state",
        )}),
        ("run: what the job does", {"fields": (
            "kind", ("flow", "command"), "task", "folder", "instructions", "image", "replicas", "wait_for",
            "secrets", "secrets_profile", "repository", "exclude_tools", ("provider", "model", "max_turns"),
            "max_cost_usd", "allow_ci_changes", "resume",
        )}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(run_total=Count("runs"))

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

    @admin.display(description="runs")
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

    @admin.display(description="recorded runs", ordering="run_total")
    def run_count(self, trigger: Trigger) -> int:
        return trigger.run_total

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

    list_display = ("delivery_id", "forge", "event", "status", "reason", "jobs", "attempts", "received_at",
                    "next_attempt_at")
    list_filter = ("status", "forge", "event", "received_at")
    search_fields = ("delivery_id", "job_ids")
    date_hierarchy = "received_at"
    show_full_result_count = False
    readonly_fields = ("forge", "delivery_id", "event", "status", "reason", "job_ids", "received_at",
                       "processed_at", "attempts", "attempted_at", "next_attempt_at", "holds_payload")
    exclude = ("payload",)
    actions = ("replay_selected", "discard_selected")

    @admin.display(description="jobs")
    def jobs(self, delivery: Delivery) -> str:
        return ", ".join(delivery.job_ids or [])

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
