# The lost-retry policy: the settings row's runs again after a lost worker, and what became of each lost attempt.
# `lost_retry` has a database default: the previous release, still writing runs during a rolling upgrade, omits it.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('worker', '0010_start_folder_run_permission'),
    ]

    operations = [
        migrations.AddField(
            model_name='dispatchsettings',
            name='lost_retries',
            field=models.PositiveSmallIntegerField(blank=True, help_text='How many times one job is run again, as a new attempt, after the worker running it died (PI_LOST_RETRIES; 0: never). A lost attempt may have spent: its dollar hold stays charged.', null=True, verbose_name='runs again after a lost worker'),
        ),
        migrations.AddField(
            model_name='run',
            name='lost_retry',
            field=models.CharField(blank=True, choices=[('retried', 'Retried'), ('used-up', 'Used Up'), ('off', 'Off'), ('cancelled', 'Cancelled')], db_default='', default='', max_length=16),
        ),
    ]
