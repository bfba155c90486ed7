"""List the jobs held on their wait-for conditions: the held part of the fleet's one view of waiting jobs."""

import json

from django.core.management.base import BaseCommand

from apps.fleet.connection import get_redis
from apps.fleet.display import age, instant, iso_instant
from apps.fleet.union import queue_union
from apps.fleet.waiting import held_jobs


class Command(BaseCommand):
    help = ("List jobs held on wait-for conditions over every queue of the fleet (target, conditions, time held, "
            "checks, faults, and the check slots denied in a row to a throttled one). `fleet status` shows the "
            "same jobs among everything else that waits.")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")

    def handle(self, *args, **options):
        redis = get_redis()
        rows = held_jobs(redis, list(queue_union(redis).queues))
        if options["json"]:
            self.stdout.write(json.dumps([{**row, "next_look_at": iso_instant(row["next_look_at"])} for row in rows],
                                         indent=2))
            return
        if not rows:
            self.stdout.write("no job is waiting on its conditions")
            return
        for row in rows:
            self.stdout.write(
                f"{row['job_id']}  {row['queue']}  {row['target']}  waits on {row['waiting_on']}"
                f"  for {age(row['held_seconds'])}  checks={row['checks']} faults={row['faults']}"
                + (f" throttled denials={row['denials']}" if row["denials"] else "")
                + f"  next look {instant(row['next_look_at'])}"
            )
        self.stdout.write(f"{len(rows)} held; cancel one with `python manage.py fleet cancel <job id>`")
