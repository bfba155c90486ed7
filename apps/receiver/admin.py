from django.contrib import admin

from .models import Delivery, Trigger


@admin.register(Trigger)
class TriggerAdmin(admin.ModelAdmin):
    list_display = ("position", "kind", "on_type", "predicate", "flow", "enabled", "note")
    list_display_links = ("position", "predicate")
    list_editable = ("enabled",)
    list_filter = ("enabled", "kind", "on_type")
    search_fields = ("flow", "note")
    ordering = ("position", "id")
    fieldsets = (
        (None, {"fields": ("position", "enabled", "note")}),
        ("on", {"fields": ("on_type", "label_any", "label_all", "label_none")}),
        ("run", {"fields": ("kind", "flow")}),
    )

    @admin.display(description="labels")
    def predicate(self, trigger: Trigger) -> str:
        parts = []
        for word, names in (("any", trigger.label_any), ("all", trigger.label_all), ("none", trigger.label_none)):
            if names:
                parts.append(f"{word}: {', '.join(names)}")
        return "; ".join(parts) or "-"


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    """The inbox. Rows carry ids and outcomes only; the payload is held just until the delivery settles."""

    list_display = ("delivery_id", "forge", "event", "status", "reason", "jobs", "received_at")
    list_filter = ("status", "forge", "event", "received_at")
    search_fields = ("delivery_id",)
    date_hierarchy = "received_at"
    show_full_result_count = False
    readonly_fields = ("forge", "delivery_id", "event", "status", "reason", "job_ids", "received_at",
                       "processed_at", "holds_payload")
    exclude = ("payload",)

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
