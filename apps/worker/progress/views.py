"""The job's live page and its JSON, served under the run admin (RunAdmin.get_urls): whoever may view runs."""

from __future__ import annotations

import re

from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.template.response import TemplateResponse

from apps.worker import run_logs
from apps.worker.progress import reading

JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,200}$")
POLL_MILLISECONDS = 1500


def _checked(request, job_id: str) -> None:
    if not request.user.has_perm("worker.view_run"):
        raise PermissionDenied
    if not JOB_ID.match(job_id):
        raise Http404("no such job id")


def live_page(request, job_id: str, *, admin_context: dict):
    _checked(request, job_id)
    return TemplateResponse(request, "admin/worker/run/live.html", {
        **admin_context, "title": f"Job {job_id}", "job_id": job_id, "poll_ms": POLL_MILLISECONDS,
        "initial": reading.live(job_id, request.user),
        # The worker streams output only with its PI_CAPTURE_JOB_LOGS (the web process's may differ).
        "shows_output": run_logs.can_view_run_log(request.user),
        # The fleet's cancel (apps/fleet/cancel.py, through the panel's view), for a job not ended yet.
        "can_cancel": request.user.has_perm("fleet.cancel_job"),
    })


def progress_json(request, job_id: str):
    _checked(request, job_id)
    response = JsonResponse(reading.live(job_id, request.user))
    response["Cache-Control"] = "no-store"
    return response
