"""Where notifications go (Endpoint), what was sent (Notification: one per endpoint, event and subject) and every try
of it (NotificationAttempt). Ids, names and numbers only: a delivery's document never holds issue text, a login or a
secret, and an endpoint holds no secret either, only the name of the environment variable that does."""

from django.core.validators import RegexValidator
from django.db import models

SECRET_VARIABLE = RegexValidator(
    r"^PI_NOTIFY_SECRET_[A-Z0-9_]{1,64}$",
    "The name of an environment variable of the notify worker, PI_NOTIFY_SECRET_<NAME> (capitals, digits, _).")


class Style(models.TextChoices):
    JSON = "json", "JSON (pidispatch's document)"
    SLACK = "slack", "Slack-compatible ({\"text\": ...})"


class Event(models.TextChoices):
    FAILURE = "failure", "a job failed for good or stopped after spending"
    SOFT_HOLD = "soft-hold", "a budget window reached its soft hold"


class Endpoint(models.Model):
    name = models.CharField(max_length=100, unique=True)
    url = models.URLField("URL", max_length=500, help_text="Where each notification is POSTed.")
    style = models.CharField(max_length=16, choices=Style.choices, default=Style.JSON)
    secret_variable = models.CharField(
        "signing secret variable", max_length=90, blank=True, validators=[SECRET_VARIABLE],
        help_text="The environment variable (of the host running `manage.py notify_worker`) holding the signing "
                  "secret, e.g. PI_NOTIFY_SECRET_OPS; its value is never stored here. Each request then carries "
                  "X-Pidispatch-Signature: sha256=HMAC(secret, timestamp + '.' + body). Blank: unsigned.")
    on_failure = models.BooleanField("failures", default=True,
                                     help_text="The failure hook's events (see PI_ON_FAILURE).")
    on_soft_hold = models.BooleanField("soft holds", default=True,
                                       help_text="A budget window reaching its soft hold (once per window).")
    enabled = models.BooleanField(default=True)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        from django.core.exceptions import ValidationError

        from .destination import DestinationRefused, judge

        try:
            judge(self.url)
        except DestinationRefused as refused:
            raise ValidationError({"url": str(refused)}) from None


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class Notification(models.Model):
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=32, choices=Event.choices)
    subject = models.CharField(max_length=200, help_text="The job id, or the budget window.")
    document = models.JSONField(help_text="What was sent: ids, names and numbers only.")
    status = models.CharField(max_length=16, choices=NotificationStatus.choices, default=NotificationStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "event", "subject"], name="notification_once")]
        indexes = [models.Index(fields=["status", "-created_at"], name="notification_status_idx")]

    def __str__(self):
        return f"{self.event} {self.subject} to {self.endpoint_id}"


class NotificationAttempt(models.Model):
    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveSmallIntegerField()
    at = models.DateTimeField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=64, blank=True, help_text="A token: timeout, refused, http-500, ...")
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["notification", "number"]
        default_permissions = ("view",)

    def __str__(self):
        return f"try {self.number} of {self.notification_id}"
