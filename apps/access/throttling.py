"""Requests per token (or per session user) per minute: PI_API_RATE, answered 429 with Retry-After.

Counted in Redis (the "api" cache), so every web process of the deployment shares the count. Redis down:
the API is not refused for it (the pause switch and the runs list must not wait on a throttle).
"""

from django.conf import settings
from django.core.cache import caches
from rest_framework.throttling import SimpleRateThrottle

from .models import ApiToken


class TokenRateThrottle(SimpleRateThrottle):
    scope = "api"

    def __init__(self):
        self.cache = caches["api"]
        super().__init__()

    def get_rate(self):
        return settings.PI_API_RATE

    def get_cache_key(self, request, view):
        if isinstance(request.auth, ApiToken):
            ident = f"token-{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request, view):
        try:
            return super().allow_request(request, view)
        except Exception:  # the counter's store is unreachable: let the request through
            return True
