"""`python manage.py doctor [--live] [--json]`: what works on this worker host, what to do about the rest
(apps/worker/doctor.py). Exit code 0 when a job could run here, 1 when something stops it."""

import json
import sys

from django.core.management.base import BaseCommand

from apps.worker import doctor


class Command(BaseCommand):
    help = "Check this host (and list the fleet's other live hosts) for what a job needs; exit 1 if one could not run."
    # The doctor reports a broken configuration; Django's own checks must not stop it before it can.
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("--live", action="store_true",
                            help="also make one cheap provider call through a gateway and ask the forges' APIs")
        parser.add_argument("--json", action="store_true", help="one JSON document")

    def handle(self, *args, **options):
        reports = doctor.diagnose(live=options["live"])
        if options["json"]:
            self.stdout.write(json.dumps(doctor.as_json(reports), indent=2))
        else:
            self.stdout.write(doctor.as_text(reports))
        sys.stdout.flush()
        sys.exit(doctor.exit_code(reports))
