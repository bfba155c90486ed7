"""Webhook intake views: thin. Verify the raw request, then hand the bytes to the intake service."""

import logging

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from . import intake
from .forge_config import forge_config
from .hooks import github
from .hooks.base import HookRefused, parse_json_object, read_bounded_body, require_json_content_type

logger = logging.getLogger("pidispatch.receiver")


def _refusal(refused: HookRefused) -> JsonResponse:
    return JsonResponse({"error": refused.error}, status=refused.status)


@csrf_exempt
def github_hook(request):
    config = forge_config().github
    if config is None:
        return JsonResponse({"error": "forge-not-configured"}, status=404)
    try:
        if request.method != "POST":
            raise HookRefused(405, "method-not-allowed")
        require_json_content_type(request)
        event, delivery_id = github.delivery_headers(request)
        body = read_bounded_body(request)
        github.verify(request, body, config.webhook_secret)
        parse_json_object(body)  # only after verification; the stored bytes are re-read on processing
    except HookRefused as refused:
        return _refusal(refused)
    answer = intake.receive("github", event, delivery_id, body)
    return JsonResponse(answer.body, status=answer.status)
