"""python manage.py replay_deliveries [--follow]: process the inbox's pending deliveries in arrival order, and
queue again the accepted jobs Redis no longer holds (apps/worker/accepted.py).

Without --follow: one pass, then exit (0 when nothing is left waiting, 1 when Redis is down or deliveries
are still pending). With --follow: the replayer loop a deployment runs beside the web server; it waits
for Redis when Redis is down and enqueues what arrived meanwhile as soon as it is back, and it rebuilds what a
Redis that came back empty or from an older copy lost (every PI_RECONCILE_SECONDS it looks anyway).
"""

import signal
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DatabaseError
from redis.exceptions import RedisError

from apps.fleet.connection import get_redis
from apps.receiver import intake
from apps.receiver.models import Delivery, DeliveryStatus
from apps.worker import accepted
from apps.worker.jobs import delivery_part


class Command(BaseCommand):
    help = "Replay pending deliveries of the inbox (in arrival order); --follow keeps doing it."

    def add_arguments(self, parser):
        parser.add_argument("--follow", action="store_true", help="keep running and replay whatever becomes due")
        parser.add_argument("--now", action="store_true", help="ignore the retry backoff of pending deliveries")
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between passes with --follow (default PI_INBOX_POLL_SECONDS)")

    def handle(self, *args, follow, now, interval, **options):
        interval = interval if interval is not None else settings.PI_INBOX_POLL_SECONDS
        self._stopping = False
        self._warn_if_redis_loses_jobs()
        if follow:
            signal.signal(signal.SIGTERM, self._stop)
            signal.signal(signal.SIGINT, self._stop)
            self.stdout.write(f"replaying the inbox every {interval:g} s; Ctrl-C stops")
            was_down, next_full_look = False, 0.0
            while not self._stopping:
                report = intake.replay_due(ignore_backoff=now, on_replayed=self._print)
                if not report.redis_down:
                    full = time.monotonic() >= next_full_look
                    if self._reconcile(full=full) and full:
                        next_full_look = time.monotonic() + settings.PI_RECONCILE_SECONDS
                if report.redis_down and not was_down:
                    self.stderr.write("Redis is unreachable: deliveries wait in the inbox until it is back")
                elif was_down and not report.redis_down:
                    self.stdout.write("Redis is back: replaying in arrival order")
                    self._warn_if_redis_loses_jobs()  # it may have come back with other settings
                was_down = report.redis_down
                self._sleep(interval)
            return
        report = intake.replay_due(ignore_backoff=now, on_replayed=self._print)
        if not report.redis_down:
            self._reconcile(full=True)
        waiting = Delivery.objects.filter(status=DeliveryStatus.PENDING).count()
        if report.moved_from_spool:
            self.stdout.write(f"moved {report.moved_from_spool} spooled delivery(ies) into the inbox")
        done = sum((report.outcomes or {}).values())
        self.stdout.write(f"replayed {done} delivery(ies); {waiting} still pending")
        if report.redis_down:
            self.stderr.write("Redis is unreachable: nothing was replayed. Start Redis, then run this again.")
            raise SystemExit(1)
        if waiting:
            self.stderr.write("pending deliveries wait for their retry time (see the inbox in the admin); "
                              "--now retries them immediately")
            raise SystemExit(1)

    def _print(self, delivery, answer):
        pending = answer.outcome == "accepted"
        state = "still pending" if pending else answer.outcome
        detail = (delivery.reason if pending else ",".join(answer.body.get("jobs", []))
                  or answer.body.get("reason") or answer.body.get("error") or "")
        self.stdout.write(f"{delivery.forge}:{delivery_part(delivery.delivery_id)} {state} {detail}".rstrip())

    def _reconcile(self, *, full: bool) -> bool:
        """The accepted jobs against Redis: every one when `full`, else only with a Redis not reconciled with yet.
        Whether it could look."""
        try:
            redis = get_redis()
            rebuilt = accepted.reconcile(redis) if full else accepted.reconcile_if_redis_changed(redis)
        except (DatabaseError, RedisError) as error:
            self.stderr.write(f"the accepted jobs could not be reconciled with Redis ({type(error).__name__}); "
                              "trying again")
            return False
        if rebuilt:
            self.stderr.write(f"Redis had lost {rebuilt} accepted job(s): queued again under their ids")
        return True

    def _warn_if_redis_loses_jobs(self):
        warning = intake.queue_durability_warning()
        if warning:
            self.stderr.write(warning)

    def _stop(self, signum, frame):
        self._stopping = True

    def _sleep(self, seconds: float):
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, seconds))
