# Chaining (apps/worker/chaining/): a run's depth in its chain, the children it enqueued, its refused requests.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('receiver', '0007_trigger_max_cost_usd'),
        ('worker', '0013_sessions'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='chain_children',
            field=models.JSONField(blank=True, default=list, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='chain_depth',
            field=models.PositiveSmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='run',
            name='chain_refusals',
            field=models.JSONField(blank=True, default=dict, null=True),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('parent_job_id', ''), _negated=True), fields=['parent_job_id'], name='run_parent_idx'),
        ),
    ]
