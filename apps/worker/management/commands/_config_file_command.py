"""The shape every `import_*` command shares: read a file, import it whole, or change nothing and say why."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.worker.config_files import ConfigFileError


class ImportCommand(BaseCommand):
    noun = ""
    importer = None
    warnings = None  # what the imported rows leave unworkable, said after the import (a list of sentences)

    def add_arguments(self, parser):
        parser.add_argument("file", help="path of the JSON file")

    def handle(self, *args, file, **options):
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {file}: {exc}") from None
        try:
            count = self.importer(text)
        except ConfigFileError as exc:
            raise CommandError(f"{file}: {exc}. Nothing was changed.") from None
        self.stdout.write(f"imported {count} {self.noun} from {file}")
        for warning in self.warnings() if self.warnings else ():
            self.stderr.write(self.style.WARNING(f"warning: {warning}"))
