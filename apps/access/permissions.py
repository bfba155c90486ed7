"""What a request may do: its token's scope, and never more than its user's Django permissions.

A view names, per action, the scope it needs and the Django permissions its user must hold:

    scopes = {"list": "read", "create": "operate"}
    required_permissions = {"list": ("worker.view_run",), "create": ("worker.start_run",)}

Session users (staff in the browsable API) have every scope, and their permissions decide.
"""

from rest_framework.permissions import BasePermission

from .models import SCOPE_RANK, ApiToken, Scope

SAFE_SCOPE = Scope.READ


class ScopeAndPermissions(BasePermission):
    message = "this token's scope or its user's permissions do not allow this"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not user or not user.is_authenticated:
            return False
        action = getattr(view, "action", None) or request.method.lower()
        needed_scope = getattr(view, "scopes", {}).get(action, SAFE_SCOPE)
        token = request.auth if isinstance(request.auth, ApiToken) else None
        if token is None and not user.is_staff:
            return False  # a session is for the admin's own staff
        if token is not None and SCOPE_RANK[token.scope] < SCOPE_RANK[needed_scope]:
            return False
        return user.has_perms(getattr(view, "required_permissions", {}).get(action, ()))
