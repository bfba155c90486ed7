"""Queue a manual run of the agent on a folder of this host.

    python manage.py dispatch_run /srv/code/app --task "Upgrade the linter config" [--flow F] [--image I] [--force]
"""

import uuid
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import RedisError

from apps.fleet.hosts import this_host
from apps.fleet.routing import host_affine_queue
from apps.worker.jobs import JobSpec, enqueue
from apps.worker.validation import FLOW_PATTERN, IMAGE_PATTERN
from apps.worker.workspace import WorkspaceRefused, check_local_folder


class Command(BaseCommand):
    help = "Queue a run of the agent on a local folder (a git repository) of this worker host."

    def add_arguments(self, parser):
        parser.add_argument("folder", help="absolute or relative path of a git repository on this host")
        parser.add_argument("--task", required=True, help="what the agent should do (the prompt)")
        parser.add_argument("--flow", default="task", help="the pi skill to follow (default: task)")
        parser.add_argument("--image", default="", help="job image (default: PI_JOB_IMAGE)")
        parser.add_argument("--force", action="store_true", help="run even with uncommitted changes")

    def handle(self, *args, folder, task, flow, image, force, **options):
        path = Path(folder).expanduser().resolve()
        if not task.strip():
            raise CommandError("--task is empty: say what the agent should do.")
        if not FLOW_PATTERN.fullmatch(flow):
            raise CommandError(f"--flow {flow!r}: use 1-64 lowercase letters, digits, '-' or '_'.")
        if image and not IMAGE_PATTERN.fullmatch(image):
            raise CommandError(f"--image {image!r} is not an image reference.")
        try:
            check_local_folder(str(path), force=force)
        except WorkspaceRefused as refused:
            hint = " Commit or stash them, or pass --force." if refused.reason == "workspace-dirty" else ""
            raise CommandError(f"{path}: {refused.hint}.{hint}") from None

        host = this_host()
        queue = host_affine_queue(host)
        spec = JobSpec(job_id=f"run-{uuid.uuid4().hex}", kind="local", folder=str(path), target_type="local",
                       flow=flow, task=task, image=image, force=force)
        try:
            enqueue(spec, queue)
        except RedisError:
            raise CommandError("Redis did not answer (REDIS_URL); nothing was queued. Start Redis and retry.") from None

        self.stdout.write(f"queued {spec.job_id} for {path} on {queue}")
        if not host.declared:
            self.stdout.write(
                "note: this host has no PI_WORKER_NAME, so the job waits on the shared queue and any worker "
                "may take it; declare PI_WORKER_NAME on hosts that hold local folders."
            )
        self.stdout.write(f"watch it: /admin/worker/run/?q={spec.job_id}  (a record appears when it ends)")
