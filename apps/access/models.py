"""API tokens: one per integration, owned by a user, limited to a scope and never beyond the user's permissions.

Only a digest is stored: the token itself is shown once, when it is made (the admin or `manage.py api_token`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Scope(models.TextChoices):
    READ = "read", "read: look at everything"
    OPERATE = "operate", "operate: start runs, cancel, pause and resume, replay deliveries"
    ADMIN = "admin", "admin: also triggers, limits, settings"


SCOPE_RANK = {Scope.READ: 1, Scope.OPERATE: 2, Scope.ADMIN: 3}


class ApiTokenQuerySet(models.QuerySet):
    def usable(self):
        now = timezone.now()
        return self.filter(revoked_at__isnull=True, user__is_active=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now))

    def revoked_or_expired(self, now=None):
        """Tokens that can never be used again (a token of an inactive user may be, once the user is active)."""
        return self.filter(models.Q(revoked_at__isnull=False) | models.Q(expires_at__lte=now or timezone.now()))


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What uses it, e.g. 'chat bot' or 'CI'.")
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.READ)
    prefix = models.CharField(max_length=16, help_text="The token's first characters, to recognise it by.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: until revoked.")
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self):
        return f"{self.prefix}… ({self.name}, {self.scope})"

    @property
    def state(self) -> str:
        if self.revoked_at:
            return "revoked"
        if self.expires_at and self.expires_at <= timezone.now():
            return "expired"
        return "active"
