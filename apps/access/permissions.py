"""What a request may do: its token's scope, and never more than its user's Django permissions.

A view names, per action, the scope it needs and the Django permissions its user must hold:

    scopes = {"list": "read", "create": "operate"}
    required_permissions = {"list": ("worker.view_run",), "create": ("worker.start_run",)}

Session users (staff in the browsable API) have every scope, and their permissions decide. HEAD runs the GET
handler and OPTIONS describes the view, so both take GET's check (a view without GET refuses them). A view that
answers more than one kind of request in one action (a run on a folder, beside a forge's) asks `allows()` again
for the rarer kind.
"""

from django.conf import settings
from rest_framework.permissions import BasePermission

from .models import SCOPE_RANK, ApiToken, Scope

SAFE_SCOPE = Scope.READ
READ_LIKE_GET = ("head", "options")


def allows(request, scope: str, permissions) -> bool:
    """May this request act with `scope` and these Django permissions? A session is for the admin's own staff."""
    user = request.user
    if not user or not user.is_authenticated:
        return False
    token = request.auth if isinstance(request.auth, ApiToken) else None
    if token is None and not user.is_staff:
        return False
    if token is not None and SCOPE_RANK[token.scope] < SCOPE_RANK[scope]:
        return False
    return user.has_perms(permissions)


def _action(request, view) -> str | None:
    """The name the view's `scopes` and `required_permissions` use for this request; None: a HEAD or OPTIONS
    where the view offers no GET."""
    method = request.method.lower()
    if method in READ_LIKE_GET:
        actions = getattr(view, "action_map", None)  # a viewset's route: its GET's action (list, retrieve, ...)
        if actions is not None:
            return actions.get("get")
        return "get" if hasattr(view, "get") else None
    return getattr(view, "action", None) or method


class ScopeAndPermissions(BasePermission):
    message = "this token's scope or its user's permissions do not allow this"

    def has_permission(self, request, view) -> bool:
        action = _action(request, view)
        if action is None:
            return False
        needed_scope = getattr(view, "scopes", {}).get(action, SAFE_SCOPE)
        return allows(request, needed_scope, getattr(view, "required_permissions", {}).get(action, ()))


class SchemaReaders(BasePermission):
    """The OpenAPI schema and its docs page: signed-in users and tokens only, unless PI_API_SCHEMA_PUBLIC opens
    them (the schema names every endpoint, filter and field)."""

    message = "the API's schema is served to signed-in users and API tokens (PI_API_SCHEMA_PUBLIC opens it)"

    def has_permission(self, request, view) -> bool:
        if settings.PI_API_SCHEMA_PUBLIC:
            return True
        return bool(request.user and request.user.is_authenticated)
