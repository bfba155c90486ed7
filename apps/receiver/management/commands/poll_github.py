"""python manage.py poll_github [--once]: GitHub's issue events, comments and pull requests of POLL_REPOS, every
POLL_INTERVAL_SECONDS, through the same intake as a webhook (apps/receiver/polling/). A deployment runs it as a
process of its own (contrib/systemd/pidispatch-poller.service) beside the replayer; SIGTERM stops it cleanly."""

import signal
import time

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from apps.receiver.polling.loop import Poller


class Command(BaseCommand):
    help = "Poll GitHub for issue events, comments and pull requests (a deployment no webhook can reach)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one cycle, then exit (1 when a repository failed)")

    def handle(self, *args, once, **options):
        try:
            poller = Poller(on_failure=self._failed)
        except ImproperlyConfigured as error:
            raise CommandError(str(error), returncode=2) from None
        self._poller = poller
        if once:
            counts = poller.cycle()
            self.stdout.write(f"polled {counts.repos} repositories: {counts.deliveries} new item(s), {counts.queued} "
                              f"queued, {counts.duplicates} duplicate(s), {counts.not_modified} unchanged feed(s)")
            if counts.rate_limited:
                self.stderr.write("GitHub's rate limit ended the poll early: it resumes from its cursors next time")
            if counts.failed or counts.rate_limited:
                raise SystemExit(1)
            return
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.stdout.write(f"polling {', '.join(poller.repos) or 'the GitHub App installation'} every "
                          f"{poller.interval} s; SIGTERM stops")
        self.stdout.flush()
        poller.run(self._sleep)
        self.stdout.write("poller stopped")

    def _failed(self, repo, failure):
        self.stderr.write(f"github:{repo}: {failure.detail}")
        self.stderr.flush()

    def _stop(self, signum, frame):
        self._poller.stop()

    def _sleep(self, seconds: float):
        deadline = time.monotonic() + seconds
        while not self._poller.stopping and time.monotonic() < deadline:
            time.sleep(min(0.2, seconds))
