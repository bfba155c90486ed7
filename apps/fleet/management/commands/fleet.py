"""`python manage.py fleet status|pause|resume|drain|undrain|cancel|retry|discard`: the operator's stop switch,
from any shell.

It needs only REDIS_URL: no system checks run (a broken forge config must not stand in the way), nothing
reads the database, and the audit row is written best-effort (the answer says when it could not be).
"""

from __future__ import annotations

import getpass
import json
import os
import sys

from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import RedisError

from apps.fleet import cancel, drains, failed, pauses, status
from apps.fleet.connection import get_redis, where
from apps.fleet.display import age, detail_text, instant
from apps.fleet.union import resolve_scope


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


class Command(BaseCommand):
    help = "Fleet status, pause and resume over the queue union, and cancel of a job in any state on any host."
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="{status,pause,resume,cancel,retry,discard}")
        show = sub.add_parser("status", help="every queue of the union, every host row, waiting and failed jobs")
        show.add_argument("--json", action="store_true", help="one JSON document")
        for name, verb in (("pause", "stop workers taking new jobs from"), ("resume", "let workers take jobs from")):
            switch = sub.add_parser(name, help=f"{verb} a queue, a host's queue, or every queue of the union")
            which = switch.add_mutually_exclusive_group(required=True)
            which.add_argument("--queue", help="one queue: pi-jobs or pi-jobs@<host>")
            which.add_argument("--host", help="a host's own queue, pi-jobs@<host>")
            which.add_argument("--all", action="store_true", help="pi-jobs and every host queue of the fleet")
            switch.add_argument("--by", help="who does it (default: cli:<OS user>)")
            if name == "pause":
                switch.add_argument("--note", default="", help="why, for the other operators")
                switch.add_argument("--until", help="auto-resume at this ISO 8601 time (with a zone)")
        drain = sub.add_parser("drain", help="a host takes no new job from any queue (the others go on); its "
                                             "running jobs finish")
        drain.add_argument("--host", required=True, help="the host's name (PI_WORKER_NAME)")
        drain.add_argument("--note", default="", help="why, for the other operators")
        drain.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                           help="wait until the host runs nothing (exit 0), at most this long (exit 1, naming "
                                "what still runs)")
        drain.add_argument("--by", help="who does it (default: cli:<OS user>)")
        undrain = sub.add_parser("undrain", help="the host takes jobs again")
        undrain.add_argument("--host", required=True, help="the host's name (PI_WORKER_NAME)")
        undrain.add_argument("--by", help="who does it (default: cli:<OS user>)")
        stop = sub.add_parser("cancel", help="cancel a job by id: removed if waiting, container stopped if running")
        stop.add_argument("job_id")
        stop.add_argument("--by", help="who does it (default: cli:<OS user>)")
        for name, text in (("retry", "start a failed job again now (a new run of its target and flow)"),
                           ("discard", "drop a failed job from the failed list (its run records stay)")):
            one = sub.add_parser(name, help=text)
            one.add_argument("job_id")
            one.add_argument("--by", help="who does it (default: cli:<OS user>)")

    def execute(self, *args, **options):
        try:
            result = super().execute(*args, **options)
            sys.stdout.flush()  # inside the try: a reader gone by now would fail the interpreter's own last flush
            return result
        except BrokenPipeError:
            # `fleet status | head`: the reader has what it wanted and left; the rest of the answer goes nowhere.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)

    def handle(self, *args, **options):
        redis = get_redis()
        by = options.get("by") or f"cli:{getpass.getuser()}"
        try:
            if options["action"] == "status":
                return self.show(redis, options["json"])
            if options["action"] == "cancel":
                return self.cancel(redis, options["job_id"], by)
            if options["action"] == "drain":
                return self.drain(redis, options["host"], options["note"], options["wait"], by)
            if options["action"] == "undrain":
                was, error = drains.undrain(redis, options["host"], by=by)
                self.say_audit(error)
                return self.stdout.write(f"host {options['host']} " + ("takes jobs again" if was else
                                                                       "was not drained; nothing was changed"))
            if options["action"] in ("retry", "discard"):
                service = failed.retry_failed if options["action"] == "retry" else failed.discard_failed
                result = service(redis, options["job_id"], by=by)
                self.say_audit(result.audit_error)
                return self.stdout.write(result.message)
            return self.switch(redis, options, by)
        except RedisError as exc:
            raise CommandError(f"could not reach Redis at {where()} ({type(exc).__name__}): is it running, "
                               "and are REDIS_URL (and REDIS_SENTINELS) right? Nothing was changed.") from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None

    def switch(self, redis, options, by: str):
        until = pauses.parse_until(options.get("until")) if options["action"] == "pause" else None
        queues, degraded = resolve_scope(redis, queue=options["queue"], host=options["host"],
                                         all_queues=options["all"])
        if options["action"] == "pause":
            result = pauses.pause(redis, queues, by=by, note=options.get("note") or "", until=until, degraded=degraded)
            line = result.summary()
            if result.ok:
                line += " — workers stop taking new jobs within a second; jobs still enqueue; running jobs finish"
                if until:
                    line += f"; resumes by itself at {until.isoformat()}"
        else:
            result = pauses.resume(redis, queues, by=by, degraded=degraded)
            line = result.summary()
        self.say_audit(result.audit_error)
        if not result.ok:
            raise CommandError(line)
        self.stdout.write(line)

    def cancel(self, redis, job_id: str, by: str):
        result = cancel.cancel_job(redis, job_id, by=by)
        self.say_audit(result.audit_error)
        self.stdout.write(result.message)

    def drain(self, redis, host: str, note: str, wait: float, by: str):
        self.say_audit(drains.drain(redis, host, by=by, note=note))
        self.stdout.write(f"host {host} drained: its workers take no new job from any queue within a second; "
                          "the rest of the fleet goes on")
        say = lambda now: self.stdout.write(  # noqa: E731
            f"  still running on {host}: {', '.join(now.running)}" if now.running else f"  {host}: {self.busy(now)}")
        now = drains.wait_until_idle(redis, host, wait, on_wait=say) if wait else drains.progress(redis, host)
        if now.idle:
            return self.stdout.write(f"host {host} is idle: safe to stop, upgrade or restart its workers")
        if not now.known:
            raise CommandError(f"no worker host named {host} is in the registry (a typo? PI_WORKER_NAME on that "
                               "host says its name); it is marked drained all the same")
        message = f"host {host} {self.busy(now)}"
        if wait:
            raise CommandError(f"{message} after {wait:g} s: wait longer, or cancel them (fleet cancel <job id>)")
        then = "they finish first" if now.running else "each sees it within a second"
        self.stdout.write(f"{message}: {then} (fleet drain --host {host} --wait SECONDS waits for them)")

    @staticmethod
    def busy(now) -> str:
        """What keeps a drained host from being idle: the jobs it runs, or workers that have not yet seen the drain
        (each sees it within a second; one that took a job just before says it runs that job instead)."""
        if now.running:
            return f"still runs {', '.join(now.running)}"
        return f"has {len(now.unsettled)} worker(s) that have not yet seen the drain"

    def say_audit(self, error: str):
        if error:
            self.stderr.write(f"note: the audit row could not be written ({error}); the change itself is in Redis")

    def show(self, redis, as_json: bool):
        snap = status.snapshot(redis)
        if as_json:
            self.stdout.write(json.dumps(snap.as_json(), indent=2))
            return
        out = self.stdout.write
        totals = snap.totals
        out(f"fleet {snap.state}: {len(snap.queues)} queue(s), {sum(q.paused for q in snap.queues)} paused · "
            f"{totals['queued']} queued · {totals['scheduled']} deferred/scheduled · {totals['running']} running · "
            f"{totals['failed']} failed   ({instant(snap.taken_at)})")
        if snap.degraded:
            out(f"fleet view degraded: {snap.degraded}")
        rows = [["QUEUE", "STATE", "QUEUED", "DEFERRED", "RUNNING", "FAILED", "PAUSED BY", "SINCE", "UNTIL", "NOTE"]]
        for q in snap.queues:
            flag = q.pause
            rows.append([q.name, "paused" if flag else "running", q.queued, q.scheduled, q.running, q.failed,
                         flag.by if flag else "", flag.at.strftime("%Y-%m-%d %H:%M:%SZ") if flag and flag.at else "",
                         flag.until.isoformat() if flag and flag.until else "", flag.note if flag else ""])
        out("\n".join(table(rows)))
        out("")
        if snap.hosts is None:
            out("hosts: the registry could not be read")
        elif not snap.hosts:
            out("hosts: no worker host has published a registry row")
        else:
            rows = [["HOST", "LIVENESS", "DRAINED", "BEAT", "PROCS", "BUSY", "CAP", "ROUTES", "QUEUES",
                     "CAPABILITIES", "RUNNING", "IMAGE", "VERSION"]]
            for h in snap.hosts:
                running = ", ".join(
                    f"{j.job_id} ({age(snap.taken_at - j.started_at)}{' ' + j.target if j.target else ''})"
                    for j in h.running)
                drained = snap.drained.get(h.name)
                rows.append([h.name, h.liveness, f"yes, by {drained.by}" if drained else "no",
                             f"{age(h.beat_age(snap.taken_at))} ago", len(h.processes), h.busy,
                             h.concurrency or "-", "yes" if h.routes else "no", ",".join(h.queues) or "-",
                             ",".join(h.capabilities) or "-", running or "-", h.image or "-", h.version or "-"])
            out("\n".join(table(rows)))
        if snap.waiting:
            out("")
            rows = [["WAITING", "QUEUE", "KIND", "REASON", "UNTIL", "WAITED", "TARGET", "DETAIL"]]
            for w in snap.waiting:
                rows.append([w.job_id, w.queue, w.kind, w.reason, instant(w.until),
                             age(snap.taken_at - w.since) if w.since else "-", w.target or "-",
                             detail_text(w.detail) or "-"])
            out("\n".join(table(rows)))
        if snap.failed:
            out("")
            rows = [["FAILED", "QUEUE", "ENDED"]] + [[f.job_id, f.queue, instant(f.failed_at)] for f in snap.failed]
            out("\n".join(table(rows)))
