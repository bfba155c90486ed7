"""Admin building blocks shared by the apps."""

from django.contrib import messages
from django.utils.html import conditional_escape


class ReadOnlyAdminMixin:
    """Records that are evidence (run history, audit rows): shown, never added, edited or deleted here."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class PlainHelpTextsAdmin:
    """Help texts are plain text. The admin's templates mark them safe, so a placeholder such as `<time with zone>`
    would vanish as an unknown tag: each is escaped once here."""

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None and field.help_text:
            field.help_text = conditional_escape(field.help_text)
        return field


class ManagedChangesAdmin:
    """Models whose rows decide what worker hosts run or spend (triggers, scoped limits, the settings row):
    adding, changing and deleting them is one permission of the model's own (`manage_permission`, declared
    in its Meta.permissions), never one of Django's model permissions granted along with the rest.
    Superusers hold it, as they hold every permission. Whoever may only view is shown the rows read-only
    and told which permission changes them."""

    manage_permission = ""  # "app_label.codename"

    def has_manage_permission(self, request) -> bool:
        return request.user.has_perm(self.manage_permission)

    def has_add_permission(self, request):
        return self.has_manage_permission(request)

    def has_change_permission(self, request, obj=None):
        return self.has_manage_permission(request)

    def has_delete_permission(self, request, obj=None):
        return self.has_manage_permission(request)

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or self.has_manage_permission(request)

    def manage_permission_name(self) -> str:
        codename = self.manage_permission.partition(".")[2]
        return dict(self.model._meta.permissions)[codename]

    def _say_read_only(self, request) -> None:
        if request.method != "GET" or self.has_manage_permission(request) or not self.has_view_permission(request):
            return
        message = f"Read only: changing these needs the permission “{self.manage_permission_name()}”"
        self.message_user(request, f"{message} (superusers have it).", messages.INFO)

    def changelist_view(self, request, extra_context=None):
        self._say_read_only(request)
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        self._say_read_only(request)
        return super().change_view(request, object_id, form_url, extra_context)
