from django.db import models


class Outcome(models.TextChoices):
    COMPLETED = "completed"
    POLICY = "policy"
    FAILED = "failed"


class RunQuerySet(models.QuerySet):
    def for_job(self, job_id: str):
        return self.filter(job_id=job_id).order_by("attempt")


class Run(models.Model):
    """One attempt of one job (DESIGN section 8). Append-only and PII-free: ids, names and numbers only.

    A job that was deferred or removed before it ran has no row; every refusal, every terminal outcome
    and every infrastructure attempt has exactly one.
    """

    job_id = models.CharField(max_length=200)
    attempt = models.PositiveSmallIntegerField(default=1)
    kind = models.CharField(max_length=16)
    target = models.CharField(max_length=300, blank=True)
    scope = models.CharField(max_length=300, blank=True)
    flow = models.CharField(max_length=100, blank=True)
    command = models.CharField(max_length=200, blank=True)
    trigger = models.ForeignKey(
        "receiver.Trigger", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    trigger_type = models.CharField(max_length=32, blank=True)
    delivery_id = models.CharField(max_length=200, blank=True)
    host = models.CharField(max_length=64, blank=True)
    queue = models.CharField(max_length=100, blank=True)
    image = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    reason = models.CharField(max_length=64, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    turns = models.PositiveIntegerField(null=True, blank=True)
    tokens_in = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_out = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_total = models.PositiveBigIntegerField(null=True, blank=True)
    cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    usage = models.JSONField(null=True, blank=True, help_text="Per-model usage ledger from the exit line.")
    budget_reserved = models.BooleanField(default=False)
    replica = models.PositiveSmallIntegerField(null=True, blank=True)
    replicas = models.PositiveSmallIntegerField(null=True, blank=True)
    parent_job_id = models.CharField(max_length=200, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["job_id", "attempt"], name="run_job_attempt_unique")]
        indexes = [
            models.Index(fields=["-started_at"], name="run_started_idx"),
            models.Index(fields=["outcome", "-started_at"], name="run_outcome_idx"),
            models.Index(fields=["reason"], name="run_reason_idx"),
            models.Index(fields=["scope", "-started_at"], name="run_scope_idx"),
            models.Index(fields=["host", "-started_at"], name="run_host_idx"),
            models.Index(fields=["job_id"], name="run_job_idx"),
        ]

    def __str__(self):
        return f"{self.job_id} #{self.attempt} {self.outcome}"

    @property
    def duration(self):
        return self.ended_at - self.started_at
