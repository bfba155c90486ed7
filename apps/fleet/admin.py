"""The fleet panel (django-rq's pattern: a placeholder model, `get_urls`, `admin_view`) and the audit log.

Every state change is a POST with CSRF that calls the same service function as `manage.py fleet`.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from redis.exceptions import RedisError

from pidispatch_site.admin_mixins import ReadOnlyAdminMixin

from . import cancel, drains, failed, panel, pauses
from .connection import get_redis
from .models import FleetAction, FleetPanel
from .union import resolve_scope

VIEW, PAUSE, CANCEL = "fleet.view_fleet", "fleet.pause_fleet", "fleet.cancel_job"
START = "worker.start_run"


@admin.register(FleetAction)
class FleetActionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The audit trail: read-only evidence of who paused, resumed or cancelled what."""

    list_display = ("at", "action", "actor", "queue_list", "job_id", "note", "until", "outcome")
    list_filter = ("action", "at")
    search_fields = ("actor", "job_id", "note")
    date_hierarchy = "at"
    show_full_result_count = False

    @admin.display(description="queues")
    def queue_list(self, action: FleetAction) -> str:
        return ", ".join(action.queues or [])


@admin.register(FleetPanel)
class FleetPanelAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("", view(self.panel_view), name="fleet_fleetpanel_changelist"),
            path("body/", view(self.body_view), name="fleet_panel_body"),
            path("pause/", view(self.pause_view), name="fleet_pause"),
            path("resume/", view(self.resume_view), name="fleet_resume"),
            path("cancel/", view(self.cancel_view), name="fleet_cancel"),
            path("retry/", view(self.retry_view), name="fleet_retry"),
            path("discard/", view(self.discard_view), name="fleet_discard"),
            path("drain/", view(self.drain_view), name="fleet_drain"),
            path("undrain/", view(self.undrain_view), name="fleet_undrain"),
        ]

    def has_module_permission(self, request):
        return request.user.has_perm(VIEW)

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW)

    # --- reading ----------------------------------------------------------------------------------------

    def _context(self, request: HttpRequest) -> dict:
        if not request.user.has_perm(VIEW):
            raise PermissionDenied
        return {
            **self.admin_site.each_context(request),
            **panel.context(get_redis()),
            "title": "Fleet",
            "opts": self.model._meta,
            "can_pause": request.user.has_perm(PAUSE),
            "can_cancel": request.user.has_perm(CANCEL),
            "can_retry": request.user.has_perm(CANCEL) and request.user.has_perm(START),
            "refresh_seconds": settings.PI_FLEET_PANEL_REFRESH_SECONDS,
            "suggested_until": pauses.suggested_until(),
        }

    def panel_view(self, request: HttpRequest) -> HttpResponse:
        return TemplateResponse(request, "admin/fleet/panel.html", self._context(request))

    def body_view(self, request: HttpRequest) -> HttpResponse:
        """The refreshed part of the panel, fetched every few seconds by the page's script."""
        return TemplateResponse(request, "admin/fleet/_panel_body.html", self._context(request))

    # --- changing (POST + CSRF, one service function each) ----------------------------------------------

    def _actor(self, request: HttpRequest) -> str:
        # The audit row and the pause flag name the person (the CLI's rows say cli:<OS user>, the API's api:...).
        return request.user.get_username()

    def _back(self):
        return redirect(reverse("admin:fleet_fleetpanel_changelist"))

    def _refused(self, request: HttpRequest, exc: Exception):
        """Bad input or no Redis: say why; nothing was changed."""
        why = (str(exc) if isinstance(exc, ValueError)
               else f"Redis unreachable ({type(exc).__name__}); nothing was changed")
        self.message_user(request, why, messages.ERROR)
        return self._back()

    def _switch(self, request: HttpRequest, action: str):
        if not request.user.has_perm(PAUSE):
            raise PermissionDenied
        scope = request.POST.get("scope", "")
        all_queues = scope == "all"
        try:
            if action == "pause" and all_queues and (request.POST.get("confirm") != "yes"
                                                     or not request.POST.get("note", "").strip()):
                raise ValueError("pausing every queue needs a note and a confirmation; nothing was changed")
            if action == "pause" and request.POST.get("confirm") != "yes":
                raise ValueError("a pause needs its confirmation (the Pause… dialog); nothing was changed")
            until = pauses.parse_until(request.POST.get("until")) if action == "pause" else None
            redis = get_redis()
            queues, degraded = resolve_scope(redis, queue=request.POST.get("queue") if scope == "queue" else None,
                                             host=request.POST.get("host") if scope == "host" else None,
                                             all_queues=all_queues)
            if action == "pause":
                result = pauses.pause(redis, queues, by=self._actor(request), note=request.POST.get("note", ""),
                                      until=until, degraded=degraded)
            else:
                result = pauses.resume(redis, queues, by=self._actor(request), degraded=degraded)
        except (ValueError, RedisError) as exc:
            return self._refused(request, exc)
        level = (messages.SUCCESS if result.ok and not result.degraded
                 else messages.WARNING if result.ok else messages.ERROR)
        self.message_user(request, result.summary(), level)
        if result.audit_error:
            self.message_user(request, f"the audit row could not be written ({result.audit_error})", messages.WARNING)
        return self._back()

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        return self._switch(request, "pause") if request.method == "POST" else HttpResponseNotAllowed(["POST"])

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        return self._switch(request, "resume") if request.method == "POST" else HttpResponseNotAllowed(["POST"])

    def cancel_view(self, request: HttpRequest) -> HttpResponse:
        return self._cancel(request) if request.method == "POST" else HttpResponseNotAllowed(["POST"])

    def retry_view(self, request: HttpRequest) -> HttpResponse:
        return (self._failed(request, failed.retry_failed) if request.method == "POST"
                else HttpResponseNotAllowed(["POST"]))

    def discard_view(self, request: HttpRequest) -> HttpResponse:
        return (self._failed(request, failed.discard_failed) if request.method == "POST"
                else HttpResponseNotAllowed(["POST"]))

    def drain_view(self, request: HttpRequest) -> HttpResponse:
        return self._drain(request, drain=True) if request.method == "POST" else HttpResponseNotAllowed(["POST"])

    def undrain_view(self, request: HttpRequest) -> HttpResponse:
        return self._drain(request, drain=False) if request.method == "POST" else HttpResponseNotAllowed(["POST"])

    def _drain(self, request: HttpRequest, *, drain: bool) -> HttpResponse:
        # A drain stops a host taking work, as a pause stops a queue: the same permission.
        if not request.user.has_perm(PAUSE):
            raise PermissionDenied
        host = request.POST.get("host", "").strip()
        try:
            if drain:
                error = drains.drain(get_redis(), host, by=self._actor(request), note=request.POST.get("note", ""))
                message = (f"host {host} drained: it takes no new job from any queue; its running jobs finish "
                           "(the panel shows them until it is idle)")
            else:
                was, error = drains.undrain(get_redis(), host, by=self._actor(request))
                message = f"host {host} takes jobs again" if was else f"host {host} was not drained; nothing changed"
        except (ValueError, RedisError) as exc:
            return self._refused(request, exc)
        self.message_user(request, message, messages.SUCCESS)
        if error:
            self.message_user(request, f"the audit row could not be written ({error})", messages.WARNING)
        return self._back()

    def _failed(self, request: HttpRequest, service) -> HttpResponse:
        # Retrying starts a run (spend): it takes the start-run permission as well as the fleet's cancel one.
        if not request.user.has_perm(CANCEL) or (service is failed.retry_failed and not request.user.has_perm(START)):
            raise PermissionDenied
        as_user = {"user": request.user} if service is failed.retry_failed else {}  # a folder's run: their permission
        try:
            result = service(get_redis(), request.POST.get("job_id", "").strip(), by=self._actor(request), **as_user)
        except (ValueError, RedisError) as exc:
            return self._refused(request, exc)
        self.message_user(request, result.message, messages.SUCCESS)
        if result.audit_error:
            self.message_user(request, f"the audit row could not be written ({result.audit_error})", messages.WARNING)
        return self._back()

    def _cancel(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm(CANCEL):
            raise PermissionDenied
        try:
            result = cancel.cancel_job(get_redis(), request.POST.get("job_id", "").strip(), by=self._actor(request))
        except (ValueError, RedisError) as exc:
            return self._refused(request, exc)
        self.message_user(request, result.message, messages.SUCCESS if result.changed else messages.WARNING)
        # A job's own page (its Cancel button) gets the operator back to it, to watch the cancel land.
        back = request.POST.get("next", "")
        if back and url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=False):
            return redirect(back)
        return self._back()
