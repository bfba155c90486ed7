"""No tables: the admin's cost page hangs off a placeholder model (django-rq's pattern, as the fleet panel)."""

from django.db import models


class Spend(models.Model):
    """The cost page (admin:insight_spend_changelist): who may see run records may see what they cost."""

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = verbose_name_plural = "cost page"
