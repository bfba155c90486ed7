"""`manage.py import_envelope`: the ancestor's envelope.json, refused by name until the allocation is built."""

from apps.worker.config_files import import_envelope
from apps.worker.management.commands._config_file_command import ImportCommand


class Command(ImportCommand):
    help = "Refuse an ancestor envelope.json: the allocation across projects is not built yet (nothing changes)."
    noun = "envelopes"
    importer = staticmethod(import_envelope)
