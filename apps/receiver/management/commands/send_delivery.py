"""python manage.py send_delivery --forge gitlab --event pull_request --label pi [--url URL]: try a trigger out.

Signs a sample delivery of the forge's real shape with this deployment's own webhook secret, posts it to the running
server (PI_PUBLIC_URL, which `make run` sets, else --url) and prints what became of it: the jobs it queued, or why
it was ignored or refused; then follows each job for up to --wait seconds and prints its run's outcome and page (or
why it still waits). Exit 0 when the server answered 2xx, 1 otherwise.
"""

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps import forge_registry
from apps.receiver import sample_deliveries
from apps.receiver.forge_config import ForgeConfigError

DEFAULT_URL = "http://127.0.0.1:8000"


class Command(BaseCommand):
    help = "Sign and post a sample forge delivery to the running server; print the jobs it queued or why not."

    def add_arguments(self, parser):
        parser.add_argument("--forge", required=True, choices=forge_registry.NAMES)
        parser.add_argument("--event", help="the event the matcher reads (default: the forge's issue label event): "
                            "issue, pull_request or comment on every forge, or the forge's own name: "
                            + "; ".join(f"{forge}: {', '.join(sample_deliveries.events_of(forge))}"
                                        for forge in forge_registry.NAMES))
        parser.add_argument("--label", default="pi", help="the label the issue or pull request gets (default pi)")
        parser.add_argument("--number", type=int, help="the issue or pull request number (default: a new one)")
        parser.add_argument("--comment", default="", help="a comment event's text")
        parser.add_argument("--repository", default="",
                            help="owner/name (GitLab: the project's path; Azure DevOps: the project) instead of the "
                                 "sample's")
        parser.add_argument("--url", help=f"the server's root (default PI_PUBLIC_URL, else {DEFAULT_URL})")
        parser.add_argument("--wait", type=int, default=60, help="follow the queued jobs this many seconds and print "
                            "each run's outcome and page, or why it waits (default 60; 0: do not follow)")

    def handle(self, *args, forge, event, label, number, comment, repository, url, wait, **options):
        if number is not None and number < 1:
            raise CommandError("--number must be a positive number")
        try:
            sample = sample_deliveries.build(forge, event, label=label, number=number, comment=comment,
                                             repository=repository)
        except (sample_deliveries.SampleError, ForgeConfigError) as error:
            raise CommandError(str(error)) from None
        base_url = url or settings.PI_PUBLIC_URL or DEFAULT_URL
        try:
            status, answer = sample_deliveries.post(sample, base_url)
        except OSError as error:
            raise CommandError(f"could not reach the server at {base_url} ({error}); is it running? (--url)") from None
        target = f"#{sample.number}"
        self.stdout.write(f"sent {forge} {sample.event} ({target}, delivery {sample.delivery_id}) to "
                          f"{base_url}/hooks/{forge}: HTTP {status}")
        self.stdout.write(sample_deliveries.describe(status, answer))
        if not 200 <= status < 300:
            raise CommandError(f"the server refused it: {answer.get('error') or status}")
        if answer.get("status") == "queued" and wait > 0:
            self._follow(answer.get("jobs") or [], base_url, wait)

    def _follow(self, jobs: list[str], base_url: str, seconds: int) -> None:
        """Each job's state whenever it changes, until every one has ended or `seconds` have passed."""
        said: dict[str, str] = {}
        open_jobs = list(jobs)
        deadline = time.monotonic() + seconds
        while open_jobs:
            for job_id in list(open_jobs):
                line, ended = sample_deliveries.job_state(job_id, base_url)
                if said.get(job_id) != line:
                    self.stdout.write(line)
                    said[job_id] = line
                if ended:
                    open_jobs.remove(job_id)
            if not open_jobs or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if open_jobs:
            self.stdout.write(f"still under way after {seconds} s: {', '.join(open_jobs)} (the fleet panel follows "
                              "them: /admin/fleet/fleetpanel/)")
