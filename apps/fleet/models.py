"""Fleet models: the audit trail of operator actions, and the admin panel's placeholder."""

from django.db import models
from django.utils import timezone


class FleetActionQuerySet(models.QuerySet):
    def before(self, instant):
        return self.filter(at__lt=instant)


class FleetAction(models.Model):
    """One operator action on the fleet (pause, resume, cancel, retry or discard a failed job): who, when, what, and
    how it went.

    Written after the Redis change, best-effort: the stop switch never waits on the database.
    """

    class Action(models.TextChoices):
        PAUSE = "pause"
        RESUME = "resume"
        AUTO_RESUME = "auto-resume"
        CANCEL = "cancel"
        RETRY = "retry"
        DISCARD = "discard"
        DRAIN = "drain"
        UNDRAIN = "undrain"

    at = models.DateTimeField(default=timezone.now, db_index=True)
    action = models.CharField(max_length=16, choices=Action.choices)
    actor = models.CharField(max_length=150, help_text="Operator account (admin user or OS user of the command).")
    queues = models.JSONField(default=list, blank=True)
    job_id = models.CharField(max_length=200, blank=True)
    note = models.CharField(max_length=500, blank=True)
    until = models.DateTimeField(null=True, blank=True, help_text="Auto-resume time of a pause.")
    outcome = models.CharField(max_length=500)

    objects = FleetActionQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self):
        return f"{self.action} by {self.actor} at {self.at:%Y-%m-%d %H:%M:%S}"


class QueuePause(models.Model):
    """A queue's pause as the record keeps it. Redis's flag (pauses.py) is what workers read each second; this row is
    what it is rebuilt from when Redis lost its data (state.py), so a pause outlives Redis too."""

    queue = models.CharField(max_length=200, unique=True)
    by = models.CharField(max_length=150)
    at = models.DateTimeField()
    note = models.CharField(max_length=500, blank=True)
    until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["queue"]
        default_permissions = ()

    def __str__(self):
        return f"{self.queue} paused by {self.by}"


class HostDrain(models.Model):
    """A host's drain as the record keeps it (drains.py's flag is its cache; state.py rebuilds it)."""

    host = models.CharField(max_length=100, unique=True)
    by = models.CharField(max_length=150)
    at = models.DateTimeField()
    note = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["host"]
        default_permissions = ()

    def __str__(self):
        return f"{self.host} drained by {self.by}"


class CancelRequest(models.Model):
    """An operator's cancel of a job as the record keeps it, for as long as cancel.py's Redis request lives
    (PI_FLEET_CANCEL_TTL_SECONDS): a Redis that lost its data gets it back, so a job an operator stopped stays
    stopped (the ladder's first gate refuses it, its worker never retries it)."""

    job_id = models.CharField(max_length=200, unique=True)
    by = models.CharField(max_length=150)
    at = models.DateTimeField()
    until = models.DateTimeField(help_text="When the request expires in Redis too.")

    class Meta:
        ordering = ["-at"]
        default_permissions = ()

    def __str__(self):
        return f"cancel of {self.job_id} by {self.by}"


class FleetPanel(models.Model):
    """No table: the admin's fleet panel hangs off this model (django-rq's placeholder pattern)."""

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = "fleet panel"
        verbose_name_plural = "fleet panel"
        permissions = [
            ("view_fleet", "Can view the fleet panel"),
            ("pause_fleet", "Can pause and resume queues"),
            ("cancel_job", "Can cancel jobs"),
        ]
