"""`manage.py export_limits`: the scoped limits as the ancestor's scoped-limits.json."""

from django.core.management.base import BaseCommand

from apps.worker.config_files import export_limits


class Command(BaseCommand):
    help = "Print the scoped limits as an ancestor scoped-limits.json."

    def handle(self, *args, **options):
        self.stdout.write(export_limits(), ending="")
