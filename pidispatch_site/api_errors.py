"""Every API error is JSON with a token: `{"error": "invalid", "fields": {...}}`, `{"error": "not-authenticated",
"detail": "..."}` (DESIGN section 3's shape, with the detail a person can act on)."""

from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.views import exception_handler as drf_exception_handler

TOKENS = {
    Http404: "not-found", PermissionDenied: "forbidden",  # Django's own, which DRF answers as its NotFound and 403
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


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {"type": "string", "description": "a stable token: invalid, not-authenticated, forbidden, ..."},
        "detail": {"type": "string", "description": "what went wrong, said so a person can act on it"},
        "fields": {"type": "object", "additionalProperties": True,
                   "description": "per field, the rules it broke (400 invalid only)"},
    },
}
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_DESCRIPTIONS = {
    "400": "The request broke a rule: `fields` names each field and the rule.",
    "401": "No credentials, or a token that is unknown, revoked or past its expiry.",
    "403": "The token's scope or its user's permissions do not allow this.",
    "404": "No such object.",
    "405": "The method is not offered here.",
    "406": "Only JSON is served.",
    "415": "Only JSON is read.",
    "429": "Too many requests for this token (PI_API_RATE); the Retry-After header says when to try again.",
    "503": "Redis did not answer: the fleet cannot be read or steered; nothing was changed.",
}


def document_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: every operation's error answers, in the one shape above, so a
    client generated from the schema knows them (and schemathesis checks them)."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            codes = ["401", "403", "405", "406", "429"]
            if method in ("post", "put", "patch") or operation.get("parameters"):
                codes += ["400", "415"] if method in ("post", "put", "patch") else ["400"]
            if "{" in path or method in ("post", "put", "patch", "delete"):
                codes.append("404")
            if path.startswith("/api/v1/fleet") or path.startswith("/api/v1/jobs") or path == "/api/v1/runs" \
                    or path.startswith("/api/v1/deliveries"):
                codes.append("503")
            responses = operation.setdefault("responses", {})
            for code in codes:
                responses.setdefault(code, {"description": _DESCRIPTIONS[code],
                                            "content": {"application/json": {"schema": _ERROR_REF}}})
    return result


def page_not_found(request, exception):
    """Django's 404 for a path no route matches: JSON in the API's shape under /api/, the stock page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "not-found", "detail": "no such resource: see /api/v1/docs/"}, status=404)
    return defaults.page_not_found(request, exception)
