"""python manage.py import_pi [--from ~/.pi/agent] [--to PI_GLOBAL_PI_DIR]

Stage the operator's own pi setup into this host's overlay, which every job mounts read-only
(apps/worker/sandbox/pi_import.py says what is staged, and what never is).
"""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.worker.sandbox import pi_import


class Command(BaseCommand):
    help = ("Stage your pi setup (skills, prompts, extensions, persona, local packages) into this host's overlay "
            "(PI_GLOBAL_PI_DIR), never your keys.")

    def add_arguments(self, parser):
        parser.add_argument("--from", dest="source", default="~/.pi/agent",
                            help="pi's agent folder to stage from (default ~/.pi/agent)")
        parser.add_argument("--to", dest="overlay", default="",
                            help="the overlay folder (default PI_GLOBAL_PI_DIR)")

    def handle(self, *args, source, overlay, **options):
        destination = overlay or settings.PI_GLOBAL_PI_DIR
        if not destination:
            raise CommandError("no overlay folder: set PI_GLOBAL_PI_DIR (the workers mount it) or give --to")
        try:
            report = pi_import.stage(Path(source).expanduser(), Path(destination).expanduser())
        except pi_import.ImportRefused as refused:
            raise CommandError(str(refused)) from None
        for label in report.staged:
            self.stdout.write(f"staged   {label}")
        for label in report.stripped:
            self.stdout.write(f"stripped {label} (keys stay with you; the job's gateway adds the provider's key)")
        for label, why in report.skipped:
            self.stdout.write(f"skipped  {label}: {why}")
        for label, why in report.refused:
            self.stderr.write(f"refused  {label}: {why}; not staged")
        if not settings.PI_GLOBAL_PI_DIR:
            self.stdout.write("set PI_GLOBAL_PI_DIR to this folder on the workers for jobs to load it")
        self.stdout.write(f"{len(report.staged)} staged into {destination}, {len(report.refused)} refused")
