# A run on a folder of a worker host lets the agent rewrite that folder: a permission of its own.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('worker', '0009_field_validators'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='run',
            options={'ordering': ['-started_at', '-id'], 'permissions': [('publish_run', "Can publish a run's kept work again"), ('start_run', "Can start a run by hand (a forge's issue; a folder also needs start_folder_run)"), ('start_folder_run', 'Can start a run on a folder of a worker host (the agent may rewrite the folder)')]},
        ),
    ]
