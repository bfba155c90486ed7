"""The poller's loop: every repository once per cycle, a summary line per cycle, a clean stop on request."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from django.db import DatabaseError

from .feeds import poll_repo
from .reader import Counts, RateLimited, Reader, RepoFailed, poll_interval, poll_repos

logger = logging.getLogger("pidispatch.poller")

REFRESH_INSTALLATION_EVERY = 10  # cycles between two reads of the App installation's repository list


class Poller:
    def __init__(self, *, on_failure: Callable[[str, RepoFailed], None] | None = None):
        self.repos = poll_repos()
        self.interval = poll_interval()
        self.stopping = False
        self.on_failure = on_failure
        self.cycles = 0
        reader = Reader()  # refuses to start without a credential
        if not self.repos and reader.app is None:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured("set POLL_REPOS (owner/name, comma-separated), or configure a GitHub App "
                                       "to poll its installation's repositories")

    def stop(self) -> None:
        self.stopping = True

    def cycle(self) -> Counts:
        """Every repository once. A repository that fails is logged and the others go on; a rate limit ends the
        cycle (and the next waits until GitHub's reset)."""
        started = time.monotonic()
        reader = Reader()
        counts = reader.counts
        repos = self._repos(reader)
        for repo in repos:
            if self.stopping:
                break
            counts.repos += 1
            try:
                poll_repo(reader, repo)
            except RepoFailed as failure:
                counts.failed += 1
                logger.warning("poll_repo_failed repo=%s reason=%s", repo, failure.reason)
                if self.on_failure is not None:
                    self.on_failure(repo, failure)
            except DatabaseError as error:
                counts.failed += 1
                logger.warning("poll_repo_failed repo=%s reason=database error=%s", repo, type(error).__name__)
            except RateLimited as limited:
                counts.rate_limited = True
                self.rate_limited_until = limited.until + random.uniform(1, 30)
                logger.warning("poll_rate_limited repo=%s until=%d", repo, self.rate_limited_until)
                break
        self.cycles += 1
        self.poll_hint = reader.poll_hint
        logger.info("poll_cycle repos=%d fetched=%d not_modified=%d deliveries=%d queued=%d duplicates=%d failed=%d "
                    "ms=%d", counts.repos, counts.fetched, counts.not_modified, counts.deliveries, counts.queued,
                    counts.duplicates, counts.failed, (time.monotonic() - started) * 1000)
        return counts

    rate_limited_until = 0.0
    poll_hint = 0
    _installation: tuple[str, ...] = ()

    def _repos(self, reader: Reader) -> tuple[str, ...]:
        if self.repos:
            return self.repos
        if not self._installation or self.cycles % REFRESH_INSTALLATION_EVERY == 0:
            try:
                self._installation = reader.installation_repos() or self._installation
            except (RepoFailed, RateLimited) as error:
                logger.warning("poll_installation_failed reason=%s", getattr(error, "reason", "rate-limited"))
        return self._installation

    def run(self, sleep: Callable[[float], None]) -> None:
        """Cycles until stop(): a cycle in progress finishes its repository first."""
        while not self.stopping:
            self.cycle()
            pause = max(self.interval, self.poll_hint, self.rate_limited_until - time.time())
            self.rate_limited_until = 0.0
            sleep(pause)
