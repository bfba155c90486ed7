"""Notification endpoints (added and changed here), and their deliveries with every try (read-only evidence)."""

from django.contrib import admin, messages
from django.utils.html import format_html

from pidispatch_site.admin_mixins import ReadOnlyAdminMixin

from . import services
from .models import Endpoint, Notification, NotificationAttempt


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ("name", "where", "style", "signed", "on_failure", "on_soft_hold", "enabled")
    list_filter = ("enabled", "style")
    actions = ["send_test_notification"]

    @admin.display(description="host")
    def where(self, endpoint: Endpoint) -> str:
        # Only the scheme and host: a webhook URL's path is often its credential (Slack's are).
        scheme, _, rest = endpoint.url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"

    @admin.display(description="signed", boolean=True)
    def signed(self, endpoint: Endpoint) -> bool:
        return bool(endpoint.secret_variable)

    @admin.action(description="Send a test notification")
    def send_test_notification(self, request, queryset):
        for endpoint in queryset:
            delivery = services.send_test(endpoint)
            self.message_user(request, f"A test notification to {endpoint.name} is queued (delivery {delivery.pk}); "
                                       "manage.py notify_worker sends it.", messages.SUCCESS)


class AttemptInline(admin.TabularInline):
    model = NotificationAttempt
    fields = ("number", "at", "status_code", "error", "duration_ms")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Notification)
class DeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("created_at", "endpoint", "event", "subject", "status_display", "attempts", "finished_at")
    list_filter = ("status", "event", "endpoint")
    search_fields = ("subject",)
    list_select_related = ("endpoint",)
    inlines = [AttemptInline]
    actions = ["deliver_again"]
    fields = ("endpoint", "event", "subject", "status", "attempts", "created_at", "finished_at", "document")

    @admin.display(description="status", ordering="status")
    def status_display(self, delivery: Notification) -> str:
        colour = {"delivered": "green", "failed": "#ba2121"}.get(delivery.status, "inherit")
        return format_html('<span style="color: {}">{}</span>', colour, delivery.status)

    def has_change_permission(self, request, obj=None):
        # The action needs the change permission; the form stays read-only (every field is readonly).
        return request.user.has_perm("notifications.change_notification")

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    @admin.action(description="Deliver again", permissions=["change"])
    def deliver_again(self, request, queryset):
        queued = [delivery.pk for delivery in queryset if services.deliver_again(delivery)]
        skipped = queryset.count() - len(queued)
        if queued:
            self.message_user(request, f"Queued again: {', '.join(map(str, queued))}.", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"{skipped} not queued (delivered already, or Redis did not answer).",
                              messages.WARNING)


