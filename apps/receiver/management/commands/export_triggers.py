"""python manage.py export_triggers [path]: the trigger table as the ancestor's triggers.json."""

import os
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand

from apps.receiver import triggerfile, triggers


class Command(BaseCommand):
    help = "Write every trigger, in matching order, as a triggers.json file (standard output by default)."

    def add_arguments(self, parser):
        parser.add_argument("path", nargs="?", default="-", help="file to write ('-' = standard output)")

    def handle(self, *args, path, **options):
        entries = triggers.export_entries()
        text = triggerfile.render(entries)
        if path == "-":
            self.stdout.write(text, ending="")
            return
        target = Path(path)
        # Atomic: a reader never sees half a file.
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=target.parent or ".", delete=False,
                                         prefix=f".{target.name}.") as handle:
            handle.write(text)
        os.replace(handle.name, target)
        self.stderr.write(f"wrote {len(entries)} trigger(s) to {path}")
