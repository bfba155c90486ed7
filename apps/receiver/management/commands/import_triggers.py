"""python manage.py import_triggers <triggers.json> [--dry-run]: make the trigger table equal the file."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.receiver import triggerfile, triggers


class Command(BaseCommand):
    help = ("Import the ancestor's triggers.json: the file replaces the trigger table (the i-th rule updates the "
            "i-th rule, so run history keeps its rules). A file with any problem changes nothing.")

    def add_arguments(self, parser):
        parser.add_argument("path", help="the triggers.json to import ('-' reads standard input)")
        parser.add_argument("--dry-run", action="store_true", help="validate and report, change nothing")

    def handle(self, *args, path, dry_run, **options):
        text = self._read(path)
        try:
            parsed = triggerfile.parse(text)
        except triggerfile.TriggerFileError as error:
            listing = "\n".join(f"  - {problem}" for problem in error.problems)
            raise CommandError(f"{path}: not imported, nothing changed. "
                               f"{len(error.problems)} problem(s):\n{listing}") from None
        for warning in parsed.warnings:
            self.stderr.write(self.style.WARNING(f"warning: {warning}"))
        if dry_run:
            self.stdout.write(f"{path}: {len(parsed.entries)} trigger(s) are valid (dry run: nothing changed).")
            return
        report = triggers.import_file(parsed)
        for index in report.rearmed:
            self.stdout.write(self.style.WARNING(
                f"trigger at index {index}: the file has no on.disarmed, so this spent one-shot rule is armed again."))
        self.stdout.write(self.style.SUCCESS(
            f"{path}: imported {len(parsed.entries)} trigger(s): {report.created} created, {report.updated} updated, "
            f"{report.removed} removed."))

    @staticmethod
    def _read(path: str) -> str:
        if path == "-":
            import sys

            return sys.stdin.read()
        try:
            return Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CommandError(f"{path}: no such file.") from None
        except (OSError, UnicodeDecodeError) as error:
            raise CommandError(f"{path}: cannot be read ({error.__class__.__name__}).") from None
