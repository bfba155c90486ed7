"""Making, finding and revoking API tokens: the one home the admin, `manage.py api_token` and the API share."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.utils import timezone

from .models import ApiToken, Scope

TOKEN_PREFIX = "pid_"
LAST_USED_RESOLUTION = timedelta(minutes=1)  # a busy integration writes its last-used time once a minute


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(user, *, name: str, scope: str, expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """A new token for `user`; returns the row and the token itself (shown once, stored as a digest only)."""
    if scope not in Scope.values:
        raise ValueError(f"scope {scope!r}: one of {', '.join(Scope.values)}")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValueError("the expiry is in the past")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(user=user, name=name.strip() or "unnamed", scope=scope,
                                  prefix=token[:len(TOKEN_PREFIX) + 6], digest=digest(token), expires_at=expires_at)
    return row, token


def find(token: str) -> ApiToken | None:
    """The usable token row for a presented token, or None (unknown, revoked, expired, inactive user)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = ApiToken.objects.usable().select_related("user").filter(digest=digest(token)).first()
    if row is not None:
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
            row.last_used_at = now
    return row


def revoke(tokens) -> int:
    """Revoke the given token rows (a queryset); how many were still active."""
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
