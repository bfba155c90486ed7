"""The cost page's placeholder model (no table), and the tally of pruned run records that /metrics goes on counting."""

from django.db import models


class Spend(models.Model):
    """The cost page (admin:insight_spend_changelist): who may see run records may see what they cost."""

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = verbose_name_plural = "cost page"


class PrunedRuns(models.Model):
    """Run records housekeeping deleted (apps/worker/housekeeping.py), summed per batch, UTC day, outcome, reason and
project:
    /metrics goes on counting them, since a Prometheus counter never goes down, while the cost page shows the runs
    still kept. Append-only (one row per batch and group), so pruners never contend for a row; read as sums."""

    day = models.DateField()
    outcome = models.CharField(max_length=16)
    reason = models.CharField(max_length=64, blank=True)
    project = models.CharField(max_length=32, blank=True, default="", db_default="")
    runs = models.PositiveBigIntegerField()
    completed = models.PositiveBigIntegerField()
    spend = models.DecimalField(max_digits=20, decimal_places=6)
    tokens = models.PositiveBigIntegerField()
    estimated = models.PositiveBigIntegerField()

    class Meta:
        default_permissions = ()
        verbose_name = verbose_name_plural = "pruned runs"
        indexes = [models.Index(fields=["day"], name="pruned_runs_day_idx")]
