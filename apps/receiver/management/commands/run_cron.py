"""python manage.py run_cron [--once]: fire this host's cron triggers; run one per worker host.

SIGTERM or SIGINT (a service manager's stop, Ctrl-C) ends it after the pass under way, exit 0: a pass that claimed an
occurrence also enqueues it (a pass cut in between would skip that occurrence until the next).
"""

import signal
import time

from django.core.management.base import BaseCommand
from django.db import DatabaseError, close_old_connections
from django.utils import timezone
from redis.exceptions import RedisError

from apps.fleet.connection import get_redis
from apps.fleet.hosts import this_host
from apps.receiver.cron import tick


class Command(BaseCommand):
    help = "Fire the cron triggers whose folder is on this host, onto this host's queue (loops until stopped)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")

    def handle(self, *args, once, interval, **options):
        self._stopping = False
        if not once:
            signal.signal(signal.SIGTERM, self._stop)
            signal.signal(signal.SIGINT, self._stop)
        host = this_host()
        if not host.declared:
            self.stderr.write("note: PI_WORKER_NAME is not set, so cron jobs go to the shared queue pi-jobs and any "
                              "worker may take them; declare the name on hosts that hold cron folders.")
        while not self._stopping:
            try:
                result = tick(get_redis(), host, timezone.now())
                for job_id in result.fired:
                    self.stdout.write(f"fired {job_id}")
            except (RedisError, DatabaseError) as exc:
                # Keep the loop alive through an outage; the next pass catches up (latest occurrence only).
                self.stderr.write(f"cron pass failed ({type(exc).__name__}); retrying")
                close_old_connections()
            if once:
                return
            self._sleep(interval)

    def _stop(self, signum, frame):
        self._stopping = True

    def _sleep(self, seconds: float):
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, seconds))
