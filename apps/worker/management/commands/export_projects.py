"""`manage.py export_projects`: the projects as the ancestor's projects.json."""

from django.core.management.base import BaseCommand

from apps.worker.config_files import export_projects


class Command(BaseCommand):
    help = "Print the projects as an ancestor projects.json."

    def handle(self, *args, **options):
        self.stdout.write(export_projects(), ending="")
