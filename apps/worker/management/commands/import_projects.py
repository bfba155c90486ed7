"""`manage.py import_projects`: the ancestor's projects.json into projects (validated, all or nothing)."""

from apps.worker.config_files import import_projects
from apps.worker.management.commands._config_file_command import ImportCommand


class Command(ImportCommand):
    help = ("Replace the projects with those of an ancestor projects.json (all or nothing). Import it before a "
            "scoped-limits.json whose project:<id> rows name them.")
    noun = "projects"
    importer = staticmethod(import_projects)
