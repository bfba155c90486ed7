"""The fleet over the API: hosts, the queue union with its pause flags, pause and resume, a job's whereabouts
and its cancel. Every change goes through the service the admin panel and `manage.py fleet` call
(pauses.pause/resume over union.resolve_scope, cancel.cancel_job); the answers carry the same report."""

from __future__ import annotations

from dataclasses import asdict

from django.core.validators import RegexValidator
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from redis.exceptions import RedisError
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView
from rq.exceptions import NoSuchJobError
from rq.job import Job

from pidispatch_site.api_base import StrictSerializer, TextField

from . import cancel, drains, pauses, registry, waiting
from .connection import get_redis
from .status import snapshot
from .union import resolve_scope

VIEW, PAUSE, CANCEL = ("fleet.view_fleet",), ("fleet.pause_fleet",), ("fleet.cancel_job",)


class RedisUnavailable(APIException):
    status_code = 503
    default_detail = "Redis did not answer: the fleet cannot be read or steered; nothing was changed"
    default_code = "redis-unavailable"


def api_actor(request) -> str:
    token = getattr(request.auth, "prefix", "")
    return f"api:{request.user.get_username()}" + (f"({token})" if token else "")


SAYS_SOMETHING = RegexValidator(r"\S", "a note that says why (not blank)")


class PauseSerializer(StrictSerializer):
    note = TextField(required=False, allow_blank=True, max_length=pauses.NOTE_MAX, default="", trim_whitespace=False,
                     help_text="Why, for the other operators (shown beside the pause flag).")
    until = serializers.DateTimeField(required=False, allow_null=True, default=None,
                                      help_text="Resume by itself at this instant (ISO 8601 with a zone).")

    def validate_until(self, until):
        try:  # the CLI's rule: in the future, with a zone
            return pauses.parse_until(until.isoformat()) if until is not None else None
        except ValueError as error:
            raise serializers.ValidationError(str(error).replace("--until ", "")) from None


class PauseAllSerializer(PauseSerializer):
    """Pausing every queue must say why, as the panel's dialog requires."""

    note = TextField(max_length=pauses.NOTE_MAX, trim_whitespace=False, validators=[SAYS_SOMETHING],
                     help_text="Required: why every queue stops, for the other operators.")


SWITCH_RESULT = inline_serializer("SwitchResult", {
    "action": serializers.CharField(), "ok": serializers.BooleanField(),
    "changed": serializers.ListField(child=serializers.CharField()),
    "unchanged": serializers.ListField(child=serializers.CharField()),
    "failed": serializers.DictField(child=serializers.CharField()),
    "degraded": serializers.CharField(), "audit_error": serializers.CharField(), "summary": serializers.CharField()})
FLEET_DOCUMENT = inline_serializer("FleetStatus", {
    "state": serializers.CharField(), "taken_at": serializers.CharField(allow_null=True),
    "degraded": serializers.CharField(allow_null=True),
    "totals": serializers.DictField(child=serializers.IntegerField()),
    "queues": serializers.ListField(child=serializers.DictField()),
    "hosts": serializers.ListField(child=serializers.DictField(), allow_null=True),
    "waiting": serializers.ListField(child=serializers.DictField()),
    "failed": serializers.ListField(child=serializers.DictField())})


def switch_answer(result: pauses.SwitchResult) -> Response:
    body = {**asdict(result), "ok": result.ok, "summary": result.summary()}
    return Response(body, status=status.HTTP_200_OK if result.ok else status.HTTP_207_MULTI_STATUS)


class FleetStatusView(APIView):
    """The whole fleet in one read (what `manage.py fleet status --json` prints)."""

    required_permissions = {"get": VIEW}

    @extend_schema(responses={200: FLEET_DOCUMENT}, operation_id="fleet_status")
    def get(self, request):
        try:
            return Response(snapshot(get_redis()).as_json())
        except RedisError:
            raise RedisUnavailable() from None


class HostsView(APIView):
    required_permissions = {"get": VIEW}

    @extend_schema(responses={200: inline_serializer("Hosts", {"hosts": serializers.ListField(
        child=serializers.DictField())})}, operation_id="fleet_hosts")
    def get(self, request):
        try:
            document = snapshot(get_redis()).as_json()
        except RedisError:
            raise RedisUnavailable() from None
        return Response({"hosts": document["hosts"] or []})


DRAIN_RESULT = inline_serializer("DrainResult", {
    "host": serializers.CharField(), "drained": serializers.BooleanField(), "changed": serializers.BooleanField(),
    "running": serializers.ListField(child=serializers.CharField()), "audit_error": serializers.CharField()})


class DrainSerializer(StrictSerializer):
    note = TextField(required=False, allow_blank=True, max_length=pauses.NOTE_MAX, default="",
                                 trim_whitespace=False)


class DrainView(APIView):
    """Drain a host: the admin's and `fleet drain`'s service. The answer lists what it still runs; poll
    GET /fleet/hosts until that is empty (the CLI's --wait does)."""

    scopes = {"post": "operate"}
    required_permissions = {"post": PAUSE}
    drains_host = True

    def change(self, redis, name: str, request) -> tuple[bool, str, list[str]]:
        serializer = DrainSerializer(data=request.data if request.body else {})
        serializer.is_valid(raise_exception=True)
        was = drains.is_drained(redis, name)
        error = drains.drain(redis, name, by=api_actor(request), note=serializer.validated_data["note"])
        return not was, error, drains.progress(redis, name).running

    @extend_schema(request=DrainSerializer, responses={200: DRAIN_RESULT})
    def post(self, request, name: str):
        try:
            changed, error, running = self.change(get_redis(), name, request)
        except ValueError as exc:
            raise ValidationError({"name": [str(exc)]}) from None
        except RedisError:
            raise RedisUnavailable() from None
        return Response({"host": name, "drained": self.drains_host, "changed": changed, "running": running,
                         "audit_error": error})


class UndrainView(DrainView):
    """Let a drained host take jobs again."""

    drains_host = False

    def change(self, redis, name: str, request) -> tuple[bool, str, list[str]]:
        if request.body and request.data not in ({}, None):
            raise ValidationError({"non_field_errors": ["undrain takes no fields"]})
        changed, error = drains.undrain(redis, name, by=api_actor(request))
        return changed, error, []

    @extend_schema(request=None, responses={200: DRAIN_RESULT})
    def post(self, request, name: str):
        return super().post(request, name)



class QueuesView(APIView):
    required_permissions = {"get": VIEW}

    @extend_schema(responses={200: inline_serializer("Queues", {"state": serializers.CharField(), "queues":
                                                                 serializers.ListField(child=serializers.DictField())})},
                   operation_id="fleet_queues")
    def get(self, request):
        try:
            document = snapshot(get_redis()).as_json()
        except RedisError:
            raise RedisUnavailable() from None
        return Response({"state": document["state"], "queues": document["queues"]})


class SwitchView(APIView):
    """Pause or resume one queue (`queues/<name>/pause`) or the whole union (`pause-all`)."""

    every_queue = False
    scopes = {"post": "operate"}
    required_permissions = {"post": PAUSE}

    def switch(self, redis, queues, degraded, request):
        raise NotImplementedError

    def post(self, request, name: str | None = None):
        try:
            redis = get_redis()
            queues, degraded = resolve_scope(redis, queue=name, all_queues=self.every_queue)
            result = self.switch(redis, queues, degraded, request)
        except ValueError as error:
            raise ValidationError({"queue": [str(error)]}) from None
        except RedisError:
            raise RedisUnavailable() from None
        return switch_answer(result)


class PauseView(SwitchView):
    serializer_class = PauseSerializer

    def switch(self, redis, queues, degraded, request):
        serializer = self.serializer_class(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        return pauses.pause(redis, queues, by=api_actor(request), note=values["note"], until=values["until"],
                            degraded=degraded)

    @extend_schema(request=PauseSerializer, responses={200: SWITCH_RESULT, 207: SWITCH_RESULT})
    def post(self, request, name: str | None = None):
        return super().post(request, name)


class PauseAllView(PauseView):
    every_queue = True
    serializer_class = PauseAllSerializer

    @extend_schema(request=PauseAllSerializer, responses={200: SWITCH_RESULT, 207: SWITCH_RESULT},
                   operation_id="fleet_pause_all")
    def post(self, request, name: str | None = None):
        return super().post(request, name)


class ResumeView(SwitchView):
    def switch(self, redis, queues, degraded, request):
        if request.body and request.data not in ({}, None):
            raise ValidationError({"non_field_errors": ["resume takes no fields"]})
        return pauses.resume(redis, queues, by=api_actor(request), degraded=degraded)

    @extend_schema(request=None, responses={200: SWITCH_RESULT, 207: SWITCH_RESULT})
    def post(self, request, name: str | None = None):
        return super().post(request, name)


JOB_STATE = inline_serializer("JobState", {
    "job_id": serializers.CharField(), "state": serializers.CharField(),
    "queue": serializers.CharField(allow_null=True), "host": serializers.CharField(allow_null=True),
    "waiting": serializers.DictField(allow_null=True), "runs": serializers.ListField(child=serializers.DictField())})


def locate(redis, job_id: str) -> dict:
    """Where a job is now, from Redis: queued, deferred or held (and why, until when), running (on which host),
    finished, failed, or unknown (never queued here, or finished longer ago than RQ keeps jobs)."""
    where = {"job_id": job_id, "state": "unknown", "queue": None, "host": None, "waiting": None}
    try:
        job = Job.fetch(job_id, connection=redis)
    except NoSuchJobError:
        return where
    where["queue"] = job.origin
    rq_state = job.get_status(refresh=False)
    rq_state = getattr(rq_state, "value", rq_state)
    held = waiting.list_waiting(redis, [job.origin]) if rq_state == "scheduled" else []
    note = next((entry for entry in held if entry.job_id == job_id), None)
    if note is not None:
        where["waiting"] = {**asdict(note), "until": note.until, "since": note.since}
        where["state"] = "held" if note.kind == "held" else "deferred"
    elif rq_state in ("queued", "scheduled", "deferred"):
        where["state"] = "queued" if rq_state == "queued" else "deferred"
    elif rq_state == "started":
        where["state"] = "running"
        for host in registry.read_hosts(redis):
            if any(running.job_id == job_id for running in host.running):
                where["host"] = host.name
    elif rq_state in ("finished", "failed", "stopped", "canceled"):
        where["state"] = "finished" if rq_state == "finished" else "failed"
    return where


JOB_ID = OpenApiParameter("job_id", str, OpenApiParameter.PATH, pattern=r"^[A-Za-z0-9_-]+$",
                          description="a job id, as the worker, the fleet and the run record name it")
CANCEL_RESULT = inline_serializer("CancelResult", {
    "job_id": serializers.CharField(), "outcome": serializers.CharField(), "message": serializers.CharField(),
    "changed": serializers.BooleanField(), "audit_error": serializers.CharField()})


class JobView(APIView):
    required_permissions = {"get": VIEW}

    @extend_schema(responses={200: JOB_STATE}, operation_id="job_state", parameters=[JOB_ID])
    def get(self, request, job_id: str):
        from apps.worker.api import run_summaries

        if not cancel.is_job_id(job_id):
            raise ValidationError({"job_id": ["a job id is letters, digits, '_' and '-'"]})
        try:
            where = locate(get_redis(), job_id)
        except RedisError:
            raise RedisUnavailable() from None
        where["runs"] = run_summaries(job_id)
        if where["state"] == "unknown" and where["runs"]:
            where["state"] = "finished"
        return Response(where)


class CancelView(APIView):
    scopes = {"post": "operate"}
    required_permissions = {"post": CANCEL}

    @extend_schema(request=None, responses={200: CANCEL_RESULT, 404: CANCEL_RESULT}, operation_id="job_cancel",
                   parameters=[JOB_ID])
    def post(self, request, job_id: str):
        try:
            result = cancel.cancel_job(get_redis(), job_id, by=api_actor(request))
        except ValueError as error:
            raise ValidationError({"job_id": [str(error)]}) from None
        except RedisError:
            raise RedisUnavailable() from None
        body = {**asdict(result), "changed": result.changed}
        return Response(body, status=status.HTTP_404_NOT_FOUND if result.outcome == "not-found" else 200)
