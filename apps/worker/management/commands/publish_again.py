"""Publish a run's kept work again, on the worker host that kept it (after a forge outage, say)."""

from django.core.management.base import BaseCommand, CommandError

from apps.worker.forges.publishing import kept
from apps.worker.models import Run


class Command(BaseCommand):
    help = "Publish the work a run kept after its publish step failed (run it on the host that ran the job)."

    def add_arguments(self, parser):
        parser.add_argument("job_id")

    def handle(self, *args, job_id, **options):
        run = Run.objects.for_job(job_id).last()
        if run is None:
            raise CommandError(f"no run record for {job_id}")
        try:
            publication = kept.publish_again(run)
        except kept.NothingKept:
            raise CommandError(f"no kept work for {job_id} on this host (published since, expired after "
                               f"PI_KEEP_WORK_HOURS, or kept on {run.host or 'another host'})") from None
        detail = f" #{publication.pull_request}" if publication.pull_request else ""
        self.stdout.write(f"{job_id}: {publication.outcome}{detail} {publication.url}".rstrip())
        if publication.outcome not in ("published", "commented"):
            raise CommandError(f"{job_id} was not published ({publication.outcome}); the work stays kept")
