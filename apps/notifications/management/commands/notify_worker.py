"""`python manage.py notify_worker [--burst]`: deliver the queued notifications (the `pi-notify` queue).

One process per deployment is enough (beside the web server, or on any worker host): it sends each delivery
(apps/notifications/delivery.py) and runs RQ's scheduler, which brings back a try that waits for its backoff. A job's
worker never sends one itself, so a slow or dead endpoint never holds a job up."""

from django.core.management.base import BaseCommand
from django.db import connections
from rq import Queue, SimpleWorker

from apps.fleet.connection import get_redis
from apps.notifications.services import NOTIFY_QUEUE


class NotifyWorker(SimpleWorker):
    """In the command's own process (no fork: each try is one HTTP request and a few rows)."""

    def execute_job(self, job, queue):
        try:
            return super().execute_job(job, queue)
        finally:
            connections.close_all()


class Command(BaseCommand):
    help = "Deliver the queued notifications (the pi-notify queue)."

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="Stop once the queue is empty.")

    def handle(self, *args, burst=False, **options):
        connection = get_redis()
        self.stdout.write(f"delivering notifications from {NOTIFY_QUEUE}", ending="\n")
        self.stdout.flush()
        worker = NotifyWorker([Queue(NOTIFY_QUEUE, connection=connection)], connection=connection)
        worker.work(burst=burst, with_scheduler=True, logging_level="WARNING")
