from django.db import models

from .validation import validate_trigger_fields


class TriggerType(models.TextChoices):
    LABEL = "label", "label"


class RunKind(models.TextChoices):
    GITHUB = "github", "GitHub"
    GITLAB = "gitlab", "GitLab"
    FORGEJO = "forgejo", "Forgejo / Gitea"
    AZURE = "azure", "Azure DevOps"


class TriggerQuerySet(models.QuerySet):
    def matching_order(self):
        """File order of the ancestor's triggers.json: the first matching rule wins."""
        return self.order_by("position", "id")

    def armed_for(self, kind: str, on_type: str):
        return self.filter(enabled=True, kind=kind, on_type=on_type).matching_order()


class Trigger(models.Model):
    """One rule of the trigger language: `on` (what fires it) and `run` (what the job does)."""

    position = models.PositiveIntegerField(
        default=0, help_text="Rules are tried in this order; the first match wins (the ancestor's file order)."
    )
    enabled = models.BooleanField(default=True)
    note = models.CharField(max_length=200, blank=True, help_text="Operator's note; not shown to the agent.")

    # on.*
    on_type = models.CharField("on.type", max_length=32, choices=TriggerType.choices, default=TriggerType.LABEL)
    label_any = models.JSONField(
        "on.any", default=list, blank=True, help_text="Fires when the item carries at least one of these labels."
    )
    label_all = models.JSONField(
        "on.all", default=list, blank=True, help_text="Fires only when the item carries every one of these labels."
    )
    label_none = models.JSONField(
        "on.none", default=list, blank=True, help_text="Never fires while the item carries any of these labels."
    )

    # run.*
    kind = models.CharField("run.kind", max_length=16, choices=RunKind.choices)
    flow = models.CharField("run.flow", max_length=64, help_text="The pi skill the job runs.")

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TriggerQuerySet.as_manager()

    class Meta:
        ordering = ["position", "id"]
        indexes = [models.Index(fields=["kind", "on_type", "enabled", "position"], name="trigger_match_idx")]

    def __str__(self):
        return f"#{self.position} {self.kind} {self.on_type} -> {self.flow}"

    def clean(self):
        validate_trigger_fields(self)

    def labels_match(self, labels) -> bool:
        """The label predicate: (any is empty or hit) and all present and none absent."""
        present = set(labels)
        return (
            (not self.label_any or bool(present.intersection(self.label_any)))
            and set(self.label_all) <= present
            and not present.intersection(self.label_none)
        )

    def matched_label(self, labels) -> str | None:
        present = set(labels)
        hit = next((name for name in self.label_any if name in present), None)
        return hit or (self.label_all[0] if self.label_all else None)


class DeliveryStatus(models.TextChoices):
    RECEIVED = "received", "received (being processed)"
    QUEUED = "queued"
    IGNORED = "ignored"
    REJECTED = "rejected", "rejected (malformed)"
    PENDING = "pending", "pending (waiting for Redis)"


class Delivery(models.Model):
    """The inbox: every verified delivery, stored before anything else happens.

    The payload copy exists only until the delivery is queued, ignored or rejected; afterwards the row
    keeps ids and the outcome only.
    """

    forge = models.CharField(max_length=16)
    delivery_id = models.CharField(max_length=200)
    event = models.CharField(max_length=64, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.RECEIVED)
    reason = models.CharField(max_length=64, blank=True)
    job_ids = models.JSONField(default=list, blank=True)
    payload = models.BinaryField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["-received_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["forge", "delivery_id"], name="delivery_forge_id_unique")]
        indexes = [models.Index(fields=["status", "received_at"], name="delivery_status_idx")]

    def __str__(self):
        return f"{self.forge}:{self.delivery_id}"
