"""List the jobs held on their wait-for conditions: what each waits on and for how long."""

import json

from django.core.management.base import BaseCommand
from django.utils import timezone

from apps.fleet.connection import get_redis
from apps.worker.gates.waitfor import held_jobs


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Command(BaseCommand):
    help = ("List jobs held on wait-for conditions (target, conditions, time held, checks, faults, and the "
            "check slots denied in a row to a throttled one).")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")

    def handle(self, *args, **options):
        rows = held_jobs(get_redis(), timezone.now())
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no job is waiting on its conditions")
            return
        for row in rows:
            self.stdout.write(
                f"{row['job_id']}  {row['target']}  waits on {row['waiting_on']}  for {_duration(row['held_seconds'])}"
                f"  checks={row['checks']} faults={row['faults']}"
                + (f" throttled denials={row['denials']}" if row["denials"] else "")
            )
        self.stdout.write(f"{len(rows)} held; cancel one with `python manage.py fleet cancel <job id>`")
