"""`manage.py export_pause_windows`: the quiet hours as the ancestor's pause-windows.json."""

from django.core.management.base import BaseCommand

from apps.worker.config_files import export_windows


class Command(BaseCommand):
    help = "Print the enabled pause windows as an ancestor pause-windows.json."

    def handle(self, *args, **options):
        self.stdout.write(export_windows(), ending="")
