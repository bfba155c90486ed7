"""`/metrics` (private instance only: pidispatch_site/urls.py leaves it off the public edge)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .metrics import DispatchCollector

LOOPBACK = ("127.0.0.1", "::1")
PROXY_HEADERS = ("X-Forwarded-For", "X-Real-IP", "Forwarded")


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """With PI_METRICS_TOKEN, a bearer token; without one, this host's own direct scrape only (deny by default: the
    private server name is reachable from the private network through nginx, which forwards from loopback)."""
    token = settings.PI_METRICS_TOKEN
    if not token and (request.META.get("REMOTE_ADDR") not in LOOPBACK
                      or any(name in request.headers for name in PROXY_HEADERS)):
        return HttpResponse("/metrics answers this host's own direct scrape only: set PI_METRICS_TOKEN to scrape it "
                            "from elsewhere\n", status=403, content_type="text/plain")
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return HttpResponse("a bearer token is required\n", status=401, content_type="text/plain",
                                headers={"WWW-Authenticate": "Bearer"})
    registry = CollectorRegistry(auto_describe=False)  # per scrape: nothing is kept in this process
    registry.register(DispatchCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
