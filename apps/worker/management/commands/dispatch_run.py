"""Queue a manual run of the agent on a folder of this host.

    python manage.py dispatch_run /srv/code/app --task "Upgrade the linter config" [--flow F] [--image I] [--force]
"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.worker.manual_runs import ManualRunRefused, start_local_run


class Command(BaseCommand):
    help = "Queue a run of the agent on a local folder (a git repository) of this worker host."

    def add_arguments(self, parser):
        parser.add_argument("folder", help="absolute or relative path of a git repository on this host")
        parser.add_argument("--task", required=True, help="what the agent should do (the prompt)")
        parser.add_argument("--flow", default="task", help="the pi skill to follow (default: task)")
        parser.add_argument("--image", default="", help="job image (default: PI_JOB_IMAGE)")
        parser.add_argument("--force", action="store_true", help="run even with uncommitted changes")

    def handle(self, *args, folder, task, flow, image, force, **options):
        try:
            # A command on this host: its shell holds the host's files already, so no user's permission applies.
            queued = start_local_run(folder, by=None, task=task, flow=flow, image=image, force=force)
        except ManualRunRefused as refused:
            name = f"--{refused.field} " if refused.field in ("flow", "image", "task") else ""
            force = " (--force runs it with them)" if refused.reason == "workspace-dirty" else ""
            raise CommandError(f"{name}{refused.message}{force}") from None
        self.stdout.write(f"queued {queued.job_id} for {Path(folder).expanduser().resolve()} on {queued.queue}")
        if queued.note:
            self.stdout.write(f"note: {queued.note}")
        self.stdout.write(f"watch it: /admin/worker/run/?q={queued.job_id}  (a record appears when it ends)")
