"""Admin building blocks shared by the apps."""


class ReadOnlyAdminMixin:
    """Records that are evidence (run history, audit rows): shown, never added, edited or deleted here."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
