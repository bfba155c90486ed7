"""Webhook intake views: thin. Route by path, verify the raw request, then hand the bytes to the inbox.

The forge is chosen by the URL alone, never by a header (Forgejo also sends GitHub's headers, and a
request must never choose which verification it faces).
"""

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps import forge_registry

from . import intake
from .forge_config import forge_settings
from .hooks.base import HookRefused, require_json_content_type


def _hook(forge: str):
    verify = forge_registry.hook(forge).verify

    @csrf_exempt
    def view(request):
        config = forge_settings().of(forge)
        if config is None:
            return JsonResponse({"error": "forge-not-configured"}, status=404)
        try:
            if request.method != "POST":
                raise HookRefused(405, "method-not-allowed")
            require_json_content_type(request)
            verified = verify(request, config)
        except HookRefused as refused:
            return JsonResponse({"error": refused.error}, status=refused.status)
        answer = intake.receive(forge, verified.event, verified.delivery_id, verified.body, verified.payload)
        return JsonResponse(answer.body, status=answer.status)

    view.__name__ = f"{forge}_hook"
    return view


HOOK_VIEWS = {name: _hook(name) for name in forge_registry.NAMES}
github_hook = HOOK_VIEWS["github"]  # the benchmark's and the tests' handle on the hot path


@csrf_exempt
def unknown_hook(request, name=""):
    return JsonResponse({"error": "unknown-forge"}, status=404)
