"""The workers' daily duty: housekeeping (apps/worker/housekeeping.py) once a UTC day across the fleet.

Every worker process looks once a minute, at its beat, whether today's run is due (one Redis round trip:
neither done, nor failed within the hour, nor going on). When it is, the worker starts `manage.py housekeeping
--daily` beside itself and goes on working: a run that deletes a year's backlog may take minutes, which must
not stop the worker's beats, pause flags and cancel watch. Whichever process's run takes the fleet's lock does
the day's work; the others find the day taken and exit at once. The run is the worker's child in its process
group and dies with it (a killed run loses its batch in flight and its lock lapses, and a worker tries again).

Off with PI_HOUSEKEEPING_DAILY=false (then run `manage.py housekeeping` daily from a scheduler of your own), and
in burst mode, which drains the queues and exits.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

from django.conf import settings
from redis.exceptions import RedisError

from apps.worker import housekeeping

logger = logging.getLogger("pidispatch.worker")

LOOK_SECONDS = 60


class DailyHousekeeping:
    def __init__(self, worker):
        self.worker = worker
        self.burst = False
        self.child: subprocess.Popen | None = None
        self._next_look = 0.0

    def tick(self) -> None:
        """At every beat: reap a finished run, and start one when today's is due."""
        if self.child is not None:
            code = self.child.poll()
            if code is None:
                return
            if code:
                logger.warning("housekeeping_exited code=%s pid=%s", code, self.child.pid)
            self.child = None
        if self.burst or not settings.PI_HOUSEKEEPING_DAILY:
            return
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + LOOK_SECONDS
        try:
            if not housekeeping.due_today(self.worker.connection):
                return
        except RedisError:
            return  # the worker's own outage handling says so; due again at the next look
        self.child = self._start()

    @staticmethod
    def _start() -> subprocess.Popen | None:
        from apps.worker.process.rqworker import die_with_parent

        env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE}
        try:
            child = subprocess.Popen([sys.executable, "-m", "django", "housekeeping", "--daily"], cwd=settings.BASE_DIR,
                                     env=env, stdin=subprocess.DEVNULL, close_fds=True, preexec_fn=die_with_parent)
        except OSError as error:
            logger.warning("housekeeping_not_started error=%s", type(error).__name__)
            return None
        logger.info("housekeeping_due pid=%s", child.pid)
        return child
