# A folder's concurrency is its own host's: the scoped limit's help says so.

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('worker', '0011_lost_retry_policy'),
    ]

    operations = [
        migrations.AlterField(
            model_name='scopedlimit',
            name='concurrent',
            field=models.PositiveIntegerField(blank=True, help_text="A repository's runs at the same time across all hosts; more wait, never refused. A folder runs one job at a time on its own host, whatever this says.", null=True, validators=[django.core.validators.MinValueValidator(1, 'must be at least 1 (leave it blank for no limit).')]),
        ),
    ]
