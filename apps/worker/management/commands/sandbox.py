"""python manage.py sandbox <job id> [--command CMD] | --list | --pin <job id>

A shell in a fresh container on a finished run's workspace, on the host that ran it (apps/worker/sandbox/sandboxes.py
says what it is and is not given).
"""

import re
import sys

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from apps.worker.sandbox import sandboxes

# What the sandbox printed may come from a file the agent wrote: terminal control sequences in it would act on the
# operator's terminal (retitle it, write its clipboard with OSC 52, clear it, move the cursor over earlier lines).
# Shown as text: the sequences go, and every control character but newline and tab.
TERMINAL_SEQUENCE = re.compile(rb"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: title, clipboard, links
                               rb"|\x1bP[^\x1b]*(?:\x1b\\)?"  # DCS
                               rb"|\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: colours, cursor, clearing
                               rb"|\x1b.?")  # any other escape
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(output: bytes) -> bytes:
    return CONTROL.sub("", TERMINAL_SEQUENCE.sub(b"", output).decode("utf-8", "replace")).encode()


class Command(BaseCommand):
    help = ("Open a shell in a fresh container on a finished run's workspace (this host's runs): the job's "
            "isolation, no network, no credentials.")

    def add_arguments(self, parser):
        parser.add_argument("job_id", nargs="?", help="the run's job id (its run page shows the command)")
        parser.add_argument("--command", help="run this shell command in the sandbox instead of a shell, print "
                                              "its output and exit with its code")
        parser.add_argument("--list", dest="list_runs", action="store_true", help="list this host's kept runs")
        parser.add_argument("--pin", action="store_true", help="keep the run's folder PI_SANDBOX_PIN_DAYS longer")

    def handle(self, *args, job_id, command, list_runs, pin, **options):
        if list_runs:
            return self._list()
        if not job_id:
            raise CommandError("name a job id (or --list)")
        try:
            if pin:
                until = sandboxes.pin(job_id)
                self.stdout.write(f"{job_id}: kept until {until:%Y-%m-%d %H:%M} UTC")
                return None
            if command is None:
                kept = sandboxes.find(job_id)
                if not sys.stdin.isatty():
                    raise CommandError("an interactive sandbox needs a terminal: run it from one, or give --command")
                self.stderr.write(f"sandbox on {job_id} ({kept.image}): /workspace is the run's workspace, /job its "
                                  "prompt (read-only); no network, no credentials; exit or idle logout ends it")
            finished = sandboxes.open_sandbox(job_id, command=command)
        except sandboxes.SandboxUnavailable as error:
            raise CommandError(str(error)) from None
        if finished.output:
            sys.stdout.buffer.write(terminal_safe(finished.output))
            sys.stdout.flush()
        if finished.exit_code:
            raise SystemExit(finished.exit_code)
        return None

    def _list(self):
        now = timezone.now()
        found = sandboxes.kept_runs(now)
        if not found:
            self.stdout.write(f"no kept runs on this host ({sandboxes.this_host()})")
            return
        for kept, job_id, live in found:
            if kept is None:
                self.stdout.write(f"{job_id}  expired (removed by the next sweep)")
                continue
            until = f"until {kept.until:%Y-%m-%d %H:%M} UTC" if kept.until else "kept"
            self.stdout.write(f"{job_id}  {until}  {kept.image}" + (f"  {live} sandbox(es) open" if live else ""))
