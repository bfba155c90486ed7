"""Every API error is JSON with a token: `{"error": "invalid", "fields": {...}}`, `{"error": "not-authenticated",
"detail": "..."}` (DESIGN section 3's shape, with the detail a person can act on)."""

from rest_framework import exceptions
from rest_framework.views import exception_handler as drf_exception_handler

TOKENS = {
    exceptions.ValidationError: "invalid", exceptions.NotAuthenticated: "not-authenticated",
    exceptions.AuthenticationFailed: "authentication-failed", exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not-found", exceptions.MethodNotAllowed: "method-not-allowed",
    exceptions.NotAcceptable: "not-acceptable", exceptions.UnsupportedMediaType: "unsupported-media-type",
    exceptions.Throttled: "throttled", exceptions.ParseError: "malformed",
}


def exception_handler(error, context):
    response = drf_exception_handler(error, context)
    if response is None:
        return None
    token = next((name for kind, name in TOKENS.items() if isinstance(error, kind)),
                 getattr(error, "default_code", "error"))
    if isinstance(error, exceptions.ValidationError):
        detail = error.detail if isinstance(error.detail, dict) else {"non_field_errors": error.detail}
        response.data = {"error": token, "fields": detail}
    else:
        response.data = {"error": token, "detail": str(getattr(error, "detail", error))}
    return response
