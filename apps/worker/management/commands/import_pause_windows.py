"""`manage.py import_pause_windows`: the ancestor's pause-windows.json into quiet hours (validated, all or nothing)."""

from apps.worker.config_files import import_windows
from apps.worker.management.commands._config_file_command import ImportCommand


class Command(ImportCommand):
    help = "Replace the pause windows with those of an ancestor pause-windows.json (all or nothing)."
    noun = "pause windows"
    importer = staticmethod(import_windows)
