"""`manage.py import_limits`: the ancestor's scoped-limits.json into scoped limits (validated, all or nothing)."""

from apps.worker.config_files import import_limits, limits_warnings
from apps.worker.management.commands._config_file_command import ImportCommand


class Command(ImportCommand):
    help = "Replace the scoped limits with those of an ancestor scoped-limits.json (all or nothing)."
    noun = "scoped limits"
    importer = staticmethod(import_limits)
    warnings = staticmethod(limits_warnings)
