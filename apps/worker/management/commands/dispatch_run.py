"""Queue a manual run of the agent on a folder of this host, or run a cron trigger now.

    python manage.py dispatch_run /srv/code/app --task "Upgrade the linter config" [--flow F] [--image I]
        [--provider P] [--model M] [--max-turns N] [--force]
    python manage.py dispatch_run --trigger nightly-deps
"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.worker.manual_runs import ManualRunRefused, start_cron_trigger_run, start_local_run

# The service's field names, as this command's options spell them.
OPTIONS = {"flow": "--flow", "image": "--image", "task": "--task", "provider": "--provider", "model": "--model",
           "max_turns": "--max-turns", "trigger": "--trigger"}
# What a cron trigger brings itself: none of these may be given beside --trigger.
RUN_OPTIONS = {"folder": "a folder", "task": "--task", "flow": "--flow", "image": "--image", "provider": "--provider",
               "model": "--model", "max_turns": "--max-turns", "force": "--force"}


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"--max-turns {text!r}: a whole number of turns, at least 1") from None


class Command(BaseCommand):
    help = ("Queue a run of the agent on a local folder (a git repository) of this worker host, "
            "or run a cron trigger now.")

    def add_arguments(self, parser):
        parser.add_argument("folder", nargs="?", default=None,
                            help="absolute or relative path of a git repository on this host")
        parser.add_argument("--task", default=None, help="what the agent should do (the prompt)")
        parser.add_argument("--flow", default=None, help="the pi skill to follow (default: task)")
        parser.add_argument("--image", default=None, help="job image (default: PI_JOB_IMAGE)")
        parser.add_argument("--provider", default=None, help="model provider (default: PI_PROVIDER)")
        parser.add_argument("--model", default=None, help="model (default: PI_MODEL)")
        parser.add_argument("--max-turns", dest="max_turns", default=None,
                            help="turns at most (lowers PI_MAX_TURNS, never raises it)")
        parser.add_argument("--force", action="store_true", default=None, help="run even with uncommitted changes")
        parser.add_argument("--trigger", default=None, metavar="CRON_ID",
                            help="run this cron trigger (its on.id) now, with its own folder, task and settings")

    def handle(self, *args, trigger, **options):
        try:
            if trigger is not None:
                given = [name for key, name in RUN_OPTIONS.items() if options[key] is not None]
                if given:
                    raise CommandError(f"--trigger runs the cron trigger with its own fields: drop {', '.join(given)}")
                # A command on this host: its shell holds the host's files already, so no user's permission applies.
                queued = start_cron_trigger_run(trigger, by=None)
                where = f"cron trigger {trigger}"
            else:
                if options["folder"] is None:
                    raise CommandError("name a folder (with --task), or a cron trigger with --trigger")
                if options["task"] is None:
                    raise CommandError("--task is required with a folder: say what the agent should do")
                max_turns = whole_number(options["max_turns"]) if options["max_turns"] is not None else None
                queued = start_local_run(options["folder"], by=None, task=options["task"],
                                         flow=options["flow"] or "task", image=options["image"] or "",
                                         provider=options["provider"] or "", model=options["model"] or "",
                                         max_turns=max_turns, force=bool(options["force"]))
                where = str(Path(options["folder"]).expanduser().resolve())
        except ManualRunRefused as refused:
            name = f"{OPTIONS[refused.field]} " if refused.field in OPTIONS else ""
            force = " (--force runs it with them)" if refused.reason == "workspace-dirty" and trigger is None else ""
            raise CommandError(f"{name}{refused.message}{force}") from None
        self.stdout.write(f"queued {queued.job_id} for {where} on {queued.queue}")
        if queued.note:
            self.stdout.write(f"note: {queued.note}")
        self.stdout.write(f"watch it: /admin/worker/run/?q={queued.job_id}  (a record appears when it ends)")
