"""API tokens in the admin: made (shown once), listed by prefix and last use, revoked."""

from django.contrib import admin, messages
from django.utils.html import format_html

from . import tokens
from .models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are made here (the token is shown once, on the page after saving) and revoked, never edited."""

    list_display = ("prefix_display", "name", "user", "scope", "state", "created_at", "last_used_at", "expires_at")
    list_filter = ("scope", "revoked_at")
    search_fields = ("name", "prefix", "user__username")
    fields = ("user", "name", "scope", "expires_at")
    actions = ["revoke"]

    @admin.display(description="token")
    def prefix_display(self, token: ApiToken) -> str:
        return format_html("<code>{}…</code>", token.prefix)

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        row, token = tokens.issue(obj.user, name=obj.name, scope=obj.scope, expires_at=obj.expires_at)
        obj.pk = row.pk
        self.message_user(request, format_html(
            "The token for {} (copy it now, it is not shown again): <code>{}</code>", row.name, token),
            messages.SUCCESS)

    def log_addition(self, request, obj, message):
        return super().log_addition(request, ApiToken.objects.get(pk=obj.pk), message)

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        self.message_user(request, f"revoked {tokens.revoke(queryset)} token(s)")
