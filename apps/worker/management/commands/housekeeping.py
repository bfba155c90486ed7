"""`manage.py housekeeping`: delete the rows past their retention now (apps/worker/housekeeping.py), in batches,
with progress; `--dry-run` says what would go. The workers run it once a UTC day themselves (`--daily`)."""

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from redis.exceptions import RedisError

from apps.fleet.connection import get_redis, where
from apps.fleet.display import age
from apps.worker import housekeeping

PROGRESS_SECONDS = 2.0


def counts(deleted: dict[str, int]) -> str:
    return ", ".join(f"{name} {n:,}" for name, n in deleted.items()) or "nothing"


def last_run_line(record: dict | None) -> str:
    if not record:
        return "last run: none recorded"
    at = parse_datetime(record.get("at") or "")
    when = (f"{at:%Y-%m-%d %H:%M:%S} UTC, {age((timezone.now() - at).total_seconds())} ago" if at else "?")
    return (f"last run: {when} ({record.get('how', '?')} by {record.get('by', '?')}, "
            f"{record.get('took_seconds', 0):.1f} s): {counts(record.get('deleted') or {})}")


class Command(BaseCommand):
    help = ("Delete run records past PI_RUN_RETENTION_DAYS, settled deliveries past PI_DELIVERY_RETENTION_DAYS (never "
            "a pending one), fleet audit rows past a year, expired sessions, and revoked and expired API tokens, in "
            "short batches. The workers run it once a UTC day across the fleet (PI_HOUSEKEEPING_DAILY).")

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
        parser.add_argument("--batch-size", type=int, default=housekeeping.BATCH,
                            help=f"rows per batch, each its own short transaction (default {housekeeping.BATCH})")
        parser.add_argument("--pause", type=float, default=None, metavar="SECONDS",
                            help=f"sleep between batches, to leave the database more room (default "
                                 f"{housekeeping.SQLITE_PAUSE} on SQLite, whose write lock is the whole database's, "
                                 "so writers waiting for it get their turn; 0 on PostgreSQL, where a batch locks its "
                                 "own rows only)")
        parser.add_argument("--daily", action="store_true",
                            help="the workers' daily run: only when today's has not run (or failed within the hour) "
                                 "and none is going on; log lines instead of progress")

    def handle(self, *args, **options):
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        if options["pause"] is not None and options["pause"] < 0:
            raise CommandError("--pause must not be negative")
        if options["dry_run"]:
            self.dry_run(options["batch_size"])
            return
        redis = get_redis()
        try:
            redis.ping()
            last = housekeeping.last_run(redis)
        except RedisError as error:
            raise CommandError(f"Redis does not answer at {where()} ({type(error).__name__}): "
                               "housekeeping holds the fleet's lock there and drops the cost page's kept days; "
                               "start Redis or fix REDIS_URL") from None
        daily = options["daily"]
        if not daily:
            self.stdout.write(last_run_line(last))
        try:
            report = housekeeping.housekeep(redis, how="daily" if daily else "command", daily=daily,
                                            batch=options["batch_size"], pause=options["pause"],
                                            progress=None if daily else self.progress())
        except housekeeping.Busy as error:
            raise CommandError(str(error)) from None
        except housekeeping.HousekeepingError as error:
            done = counts(error.report.deleted) if error.report else "nothing"
            raise CommandError(f"housekeeping stopped: {error}. Deleted before it stopped (and gone): {done}. "
                               "Run it again once that is fixed: it goes on from there.") from None
        if report is not None and not daily:
            self.stdout.write(f"done in {report.took_seconds:.1f} s: {counts(report.deleted)}; "
                              "recorded as the last run")

    def progress(self):
        state = {"rule": None, "at": 0.0, "started": 0.0}

        def show(rule, deleted, total):
            now = time.monotonic()
            if rule is not state["rule"]:
                state.update(rule=rule, at=now, started=now)
                self.stdout.write(f"{rule.name}: {total:,} to delete, {rule.what}")
                return
            if deleted < total and now - state["at"] < PROGRESS_SECONDS:
                return
            state["at"] = now
            took = now - state["started"]
            share = f" ({deleted * 100 // total}%)" if total and deleted < total else ""
            rate = f", {deleted / took:,.0f}/s" if took > 0.5 else ""
            self.stdout.write(f"  {rule.name}: {deleted:,} of {total:,} deleted{share}{rate}", ending="\n")
            self.stdout.flush()

        return show

    def dry_run(self, batch: int):
        try:
            planned = housekeeping.plan()
        except DatabaseError as error:
            raise CommandError(f"the database does not answer ({type(error).__name__}): {error}".strip()) from None
        try:
            self.stdout.write(last_run_line(housekeeping.last_run(get_redis())))
        except RedisError:
            self.stdout.write(f"last run: unknown (Redis does not answer at {where()})")
        self.stdout.write("dry run: nothing is deleted")
        width = max(len(rule.name) for rule, _ in planned)
        for rule, n in planned:
            self.stdout.write(f"{rule.name:<{width}}  {n:>10,}  {rule.what}")
        self.stdout.write(f"would delete {sum(n for _, n in planned):,} rows in batches of {batch:,}")
