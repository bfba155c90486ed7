"""The gate ladder (DESIGN section 6): free checks before costly ones, and the container last.

Each gate either lets the job continue or ends it with a Verdict. Running the container is the only
step that spends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from django.conf import settings
from django.utils import timezone

from . import container, jobfiles
from .exitline import parse_exit_line
from .jobs import JobSpec
from .models import Outcome
from .verdicts import Verdict

logger = logging.getLogger("pidispatch.ladder")

EXIT_COMPLETED, EXIT_INFRASTRUCTURE, EXIT_POLICY = 0, 1, 2
EXIT_KILLED = 137


@dataclass
class Attempt:
    spec: JobSpec
    host: str
    image: str = ""


def container_environment(spec: JobSpec) -> dict[str, str]:
    """The container's whole environment, from a closed list: nothing of the worker's is inherited."""
    environment = {
        "HOME": "/home/pi",
        "PI_JOB_ID": spec.job_id,
        "PI_MAX_TURNS": str(settings.PI_MAX_TURNS),
    }
    if spec.flow:
        environment["PI_FLOW"] = spec.flow
    else:
        environment["PI_COMMAND"] = spec.command
    if settings.PI_MAX_TOKENS:
        environment["PI_MAX_TOKENS"] = str(settings.PI_MAX_TOKENS)
    if settings.PI_PROVIDER:
        environment["PI_PROVIDER"] = settings.PI_PROVIDER
    if settings.PI_MODEL:
        environment["PI_MODEL"] = settings.PI_MODEL
    return environment


def classify(result: container.ContainerExit) -> Verdict:
    """Exit code to outcome. The exit line adds numbers; it never changes the classification."""
    code = result.exit_code
    telemetry = parse_exit_line(result.output_tail, code)
    fields = {"exit_code": code, "telemetry": telemetry, "budget_reserved": True}
    if result.timed_out:
        return Verdict.refused("worker-abort", **fields)
    if code == EXIT_COMPLETED:
        return Verdict(outcome=Outcome.COMPLETED, **fields)
    if code == EXIT_POLICY:
        return Verdict.refused(telemetry.reason or "runner-policy", **fields)
    if code == EXIT_KILLED and result.oom_killed:
        return Verdict.refused("oom-killed", **fields)
    if code == EXIT_INFRASTRUCTURE:
        return Verdict.infrastructure_fault("runner-infra", **fields)
    return Verdict.infrastructure_fault("container-exit-unknown", **fields)


def run(spec: JobSpec, host: str) -> Verdict:
    started_at = timezone.now()
    attempt = Attempt(spec=spec, host=host, image=spec.image or settings.PI_JOB_IMAGE)
    verdict = _climb(attempt)
    return replace(verdict, image=attempt.image, started_at=started_at, ended_at=timezone.now())


def _climb(attempt: Attempt) -> Verdict:
    spec = attempt.spec
    try:
        client = container.engine()
        container.preflight_image(client, attempt.image)
    except container.ImageMissing:
        return Verdict.refused("job-image-missing")
    except container.EngineUnavailable:
        return Verdict.infrastructure_fault("docker-unavailable")

    dirs = jobfiles.prepare(spec, settings.PI_JOB_ROOT, owner=container.job_user())
    try:
        result = container.run_container(
            client,
            job_id=spec.job_id,
            host=attempt.host,
            image=attempt.image,
            job_dir=dirs.job,
            workspace=dirs.workspace,
            environment=container_environment(spec),
            timeout_seconds=settings.PI_JOB_TIMEOUT_SECONDS,
        )
    except container.ImageMissing:
        return Verdict.refused("job-image-missing")
    except container.NeverStarted:
        return Verdict.infrastructure_fault("container-never-started")
    except container.EngineUnavailable:
        return Verdict.infrastructure_fault("docker-unavailable", budget_reserved=True)
    finally:
        if not settings.PI_KEEP_JOB_DIRS:
            jobfiles.remove(dirs)
    return classify(result)
