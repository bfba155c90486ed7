"""Runs, manual runs, limits, pause windows, settings and spend over the API.

A manual run goes through apps/worker/manual_runs.py (as `dispatch_run` and the admin's "Start a run" do); the
CRUD resources validate as their admin forms do (each model's `clean`)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    extend_schema,
    extend_schema_field,
    extend_schema_view,
    inline_serializer,
)
from redis.exceptions import RedisError
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from apps import forge_registry
from apps.access.permissions import allows
from apps.fleet.api import RedisUnavailable
from apps.fleet.connection import get_redis
from apps.worker import reasons, run_logs
from apps.worker.manual_runs import (
    FOLDER_PERMISSION,
    ManualRunRefused,
    start_cron_trigger_run,
    start_forge_run,
    start_local_run,
)
from apps.worker.models import DispatchSettings, Outcome, PauseWindow, Project, Run, ScopedLimit
from apps.worker.sandbox.workspace import FOLDER_NOT_ALLOWED
from pidispatch_site.api_base import (
    BRIEF,
    BriefMode,
    NamedFieldsModelSerializer,
    QueryFilter,
    StrictCursorPagination,
    StrictSerializer,
    WholeNumberIds,
    brief_or_full,
    filter_list,
    filter_parameters,
    instant,
    money_text,
    record_id,
    time_range,
)


class StrictModelSerializer(StrictSerializer, NamedFieldsModelSerializer):
    """A model's named fields, validated by the model's own `clean` (the admin form's rules)."""

    def validate(self, attrs):
        instance = self.instance or self.Meta.model()
        for name, value in attrs.items():
            setattr(instance, name, value)
        try:
            instance.full_clean(validate_unique=True)
        except DjangoValidationError as error:
            raise ValidationError(error.message_dict if hasattr(error, "error_dict") else
                                  {"non_field_errors": error.messages}) from None
        return {name: getattr(instance, name) for name in attrs}  # as `clean` wrote them (canonical forms)


# --- runs ------------------------------------------------------------------------------------------------------

REASON_FIELDS = {"token": serializers.CharField(), "means": serializers.CharField(), "next": serializers.CharField()}
REASONS = inline_serializer("Reason", REASON_FIELDS, many=True)


@extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True,
                     "description": "The per-model usage ledger (`models`: provider, model, calls, tokens, cost as a "
                                    "decimal string) and where it came from (`source`)."})
class UsageLedgerField(serializers.JSONField):
    """The ledger as recorded, each row's cost written as all money in the API is."""

    def to_representation(self, value):
        if isinstance(value, dict) and isinstance(value.get("models"), list):
            value = {**value, "models": [{**row, "cost": money_text(row["cost"])}
                                         if isinstance(row, dict) and isinstance(row.get("cost"), (str, int, float))
                                         and _is_amount(row["cost"]) else row for row in value["models"]]}
        return super().to_representation(value)


def _is_amount(value) -> bool:
    try:
        return Decimal(str(value)).is_finite()
    except InvalidOperation:
        return False


class RunSerializer(NamedFieldsModelSerializer):
    """One attempt of one job: ids, names, numbers and outcomes (never issue text), money as decimal strings."""

    trigger = serializers.IntegerField(source="trigger_id", allow_null=True, read_only=True)
    usage = UsageLedgerField(read_only=True)
    duration_seconds = serializers.SerializerMethodField()
    reason_explained = serializers.SerializerMethodField(
        help_text="What the reason means and what to do next (the table of GET /api/v1/reasons).")
    cost_unknown = serializers.BooleanField(
        read_only=True, help_text="True when the run spent tokens of a model without a known price: its cost is "
                                  "unknown (cost is null), never $0.")
    lost_retry_explained = serializers.SerializerMethodField(
        help_text="An attempt whose worker died: `lost; retried as attempt N`, or `lost; not retried: <why>`; "
                  "empty for any other attempt.")

    class Meta:
        model = Run
        # Named, never "__all__": a new column is public only once it is added here (the PII rule). Not
        # forge_message: the forge's own words stay on the run page (they may name an account).
        fields = ["id", "job_id", "attempt", "kind", "target", "scope", "flow", "command", "trigger", "trigger_type",
                  "delivery_id", "host", "queue", "image", "started_at", "ended_at", "duration_seconds", "outcome",
                  "reason", "reason_explained", "exit_code", "turns", "tokens_in", "tokens_out", "tokens_total",
                  "cost", "cost_unknown", "usage", "budget_reserved", "replica", "replicas", "parent_job_id",
                  "chain_depth", "chain_children", "chain_refusals", "publish_outcome", "pull_request",
                  "pushed_commits", "changed_files", "publish_url", "dollars_reserved", "dollars_charged",
                  "dollar_basis", "summary_chars", "lost_retry", "lost_retry_explained", "resumed", "resume_reason",
                  "session_bytes", "sandbox_until"]
        brief_fields = ["id", "job_id", "attempt", "outcome", "reason", "target", "ended_at"]

    def get_duration_seconds(self, run: Run) -> float:
        return round(run.duration.total_seconds(), 3)

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "token": {"type": "string"}, "means": {"type": "string"}, "next": {"type": "string"}}})
    def get_reason_explained(self, run: Run) -> dict | None:
        explained = reasons.explain(run.reason)
        return explained.as_json() if explained else None

    def get_lost_retry_explained(self, run: Run) -> str:
        return reasons.lost_retry_text(run.lost_retry, run.attempt)


def run_summaries(job_id: str) -> list[dict]:
    """A job's run records, first attempt first, for a job's whereabouts."""
    return [{"attempt": run.attempt, "outcome": run.outcome, "reason": run.reason, "ended_at": run.ended_at,
             "publish_outcome": run.publish_outcome, "pull_request": run.pull_request,
             "lost_retry": run.lost_retry, "id": run.pk}
            for run in Run.objects.for_job(job_id)]


class NewestFirst(StrictCursorPagination):
    ordering = ("-started_at", "-id")

    def get_page_size(self, request):
        self.page_size = settings.PI_API_PAGE_SIZE
        return super().get_page_size(request)


RUN_FILTERS = [
    QueryFilter("outcome", "outcome", "any of these outcomes", choices=tuple(Outcome.values)),
    *(QueryFilter(name, name, f"any of these {name} values") for name in ("reason", "kind", "host", "target", "flow",
                                                                          "job_id")),
    QueryFilter("trigger", "trigger_id", "any of these trigger ids", record_id, kind=int),
    QueryFilter("since", "started_at__gte", "started at or after (as started_at__gte)", instant, many=False,
                kind=OpenApiTypes.DATETIME),
    QueryFilter("until", "started_at__lt", "started before (as started_at__lt)", instant, many=False,
                kind=OpenApiTypes.DATETIME),
    *time_range("started_at", "started"), *time_range("ended_at", "ended"),
]


class StartRunSerializer(StrictSerializer):
    """A local folder on a host, a forge's issue/pull request, or a cron trigger now; what to do and how."""

    folder = serializers.CharField(required=False, help_text="A git repository on the worker host (absolute path, "
                                   "under a root the host declares in PI_LOCAL_ROOTS). Needs a token with the admin "
                                   "scope and the permission worker.start_folder_run.")
    host = serializers.CharField(required=False, default="", help_text="The worker host holding the folder.")
    forge = serializers.ChoiceField(choices=forge_registry.NAMES, required=False)
    repository = serializers.CharField(required=False, help_text="As the forge names it, e.g. acme/web.")
    number = serializers.IntegerField(required=False, min_value=1)
    target_type = serializers.ChoiceField(choices=["issue", "pull_request"], required=False, default="issue")
    project_id = serializers.CharField(required=False, default="")
    repository_id = serializers.CharField(required=False, default="")
    task = serializers.CharField(required=False, default="", allow_blank=True, trim_whitespace=False)
    flow = serializers.CharField(required=False, default="")
    command = serializers.CharField(required=False, default="")
    image = serializers.CharField(required=False, default="")
    provider = serializers.CharField(required=False, default="")
    model = serializers.CharField(required=False, default="")
    max_turns = serializers.IntegerField(required=False, allow_null=True, default=None)
    force = serializers.BooleanField(required=False, default=False)
    cron_trigger = serializers.CharField(required=False, help_text="A cron trigger's id (its on.id): run it now, "
                                         "with its own folder, task, model and limits, on `host` (empty: the host "
                                         "answering). Nothing else is given beside it; the same scope and "
                                         "permissions as a folder run.")

    def validate(self, attrs):
        local, forge, cron = "folder" in attrs, "forge" in attrs, "cron_trigger" in attrs
        if local + forge + cron != 1:
            raise ValidationError({"non_field_errors": ["give a folder (a local run), a forge with its repository "
                                                        "and number (a forge run), or a cron_trigger"]})
        if cron:
            given = sorted(name for name in set(self.initial_data) & set(self.fields)
                           if name not in ("cron_trigger", "host"))
            if given:
                raise ValidationError({name: ["a cron trigger runs with its own fields: leave this out"]
                                       for name in given})
        if forge and not ("repository" in attrs and "number" in attrs):
            raise ValidationError({name: ["required for a forge run"] for name in ("repository", "number")
                                   if name not in attrs})
        return attrs


QUEUED_RUN = inline_serializer("QueuedRun", {"job_id": serializers.CharField(), "queue": serializers.CharField(),
                                            "target": serializers.CharField(), "note": serializers.CharField(),
                                            "job_url": serializers.CharField()})


@extend_schema_view(
    list=extend_schema(parameters=filter_parameters(RUN_FILTERS), responses={200: brief_or_full(RunSerializer)}),
    create=extend_schema(request=StartRunSerializer, responses={202: QUEUED_RUN}),
)
class RunViewSet(BriefMode, WholeNumberIds, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                 viewsets.GenericViewSet):
    """Run records (newest first, cursor pages) and starting a manual run. A run on a folder lets the agent rewrite
    that folder of a worker host: it takes the admin scope and `worker.start_folder_run` besides the operate
    scope's `worker.start_run`, and a refused folder is answered `folder-not-allowed`, whatever the host found
    (its worker's log says what and where)."""

    serializer_class = RunSerializer
    pagination_class = NewestFirst
    scopes = {"create": "operate"}
    required_permissions = {"list": ("worker.view_run",), "retrieve": ("worker.view_run",),
                            "create": ("worker.start_run",), "log": ("worker.view_run", "worker.view_run_log")}

    @extend_schema(responses={200: inline_serializer("RunLog", {"job_id": serializers.CharField(),
                                                                 "attempt": serializers.IntegerField(),
                                                                 "log": serializers.CharField()})},
                   operation_id="run_log")
    @action(detail=True, methods=["get"])
    def log(self, request, pk=None):
        """The run's kept log, secrets scrubbed (PI_CAPTURE_JOB_LOGS; `worker.view_run_log` only)."""
        run = self.get_object()
        try:
            text = run_logs.run_log_text(run, request.user)
        except Http404 as missing:
            raise NotFound(str(missing)) from None
        return Response({"job_id": run.job_id, "attempt": run.attempt, "log": text})

    def get_queryset(self):
        runs = Run.objects.all()
        if self.action != "list":
            return runs
        return filter_list(runs, self.request.query_params, RUN_FILTERS)

    def create(self, request, *args, **kwargs):
        serializer = StartRunSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        execution = {name: values.pop(name) for name in ("task", "flow", "command", "image", "provider", "model",
                                                         "max_turns")}
        if ("folder" in values or "cron_trigger" in values) and not allows(request, "admin", (FOLDER_PERMISSION,)):
            raise PermissionDenied(f"a run on a folder needs a token with the admin scope and the permission "
                                   f"{FOLDER_PERMISSION}")
        try:
            if "cron_trigger" in values:
                queued = start_cron_trigger_run(values["cron_trigger"], by=request.user, host=values["host"])
            elif "folder" in values:
                queued = start_local_run(values["folder"], by=request.user, host=values["host"],
                                         force=values["force"], **execution)
            else:
                queued = start_forge_run(values["forge"], values["repository"], values["number"],
                                         target_type=values["target_type"], project_id=values["project_id"],
                                         repository_id=values["repository_id"], **execution)
        except ManualRunRefused as refused:
            if not refused.field:
                raise RedisUnavailable(refused.message) from None
            field = "cron_trigger" if refused.field == "trigger" else refused.field
            if refused.reason:  # the host's folder: no path, owner or state of it leaves the host
                raise ValidationError(
                    {"cron_trigger" if "cron_trigger" in values else "folder": [FOLDER_NOT_ALLOWED]}) from None
            raise ValidationError({field: [refused.message]}) from None
        return Response({"job_id": queued.job_id, "queue": queued.queue, "target": queued.target, "note": queued.note,
                         "job_url": f"/api/v1/jobs/{queued.job_id}"}, status=status.HTTP_202_ACCEPTED)


# --- limits, pause windows, settings ----------------------------------------------------------------------------

class ScopedLimitSerializer(StrictModelSerializer):
    class Meta:
        model = ScopedLimit
        fields = ["id", "scope", "day", "week", "month", "day_usd", "week_usd", "month_usd", "concurrent", "memory",
                  "cpus", "host_share", "min_jobs", "note"]
        brief_fields = ["id", "scope", "note"]


class ProjectSerializer(StrictModelSerializer):
    class Meta:
        model = Project
        fields = ["id", "slug", "name", "members"]
        brief_fields = ["id", "slug", "name"]


class PauseWindowSerializer(StrictModelSerializer):
    class Meta:
        model = PauseWindow
        fields = ["id", "scope", "starts", "ends", "tz", "days", "date_from", "date_to", "enabled", "note"]
        brief_fields = ["id", "scope", "enabled", "note"]


class DispatchSettingsSerializer(StrictModelSerializer):
    class Meta:
        model = DispatchSettings
        fields = ["daily_cap", "weekly_cap", "monthly_cap", "soft_hold_pct", "max_turns", "max_tokens",
                  "daily_token_cap", "job_memory", "job_cpus", "concurrency", "max_cost_usd", "daily_cost_usd",
                  "weekly_cost_usd", "monthly_cost_usd", "lost_retries", "updated_at"]
        read_only_fields = ["updated_at"]
        extra_kwargs = {"updated_at": {"allow_null": True}}  # null until the row is first saved


class SmallTable(BriefMode, WholeNumberIds, viewsets.ModelViewSet):
    """A whole small table in one answer (no pages), brief on request, no filters: any other parameter is a 400."""

    pagination_class = None

    def get_queryset(self):
        rows = super().get_queryset()
        return filter_list(rows, self.request.query_params, []) if self.action == "list" else rows


@extend_schema_view(list=extend_schema(parameters=[BRIEF], responses={200: brief_or_full(ScopedLimitSerializer)}))
class ScopedLimitViewSet(SmallTable):
    """Caps and concurrency for one repository or folder (what `import_limits` reads)."""

    queryset = ScopedLimit.objects.all()
    serializer_class = ScopedLimitSerializer
    scopes = {action: "admin" for action in ("create", "update", "partial_update", "destroy")}
    required_permissions = {"list": ("worker.view_scopedlimit",), "retrieve": ("worker.view_scopedlimit",),
                            **{action: ("worker.manage_limits",) for action in scopes}}


@extend_schema_view(list=extend_schema(parameters=[BRIEF], responses={200: brief_or_full(ProjectSerializer)}))
class ProjectViewSet(SmallTable):
    """Repositories and folders grouped: `project:<id>` limits cap them together (what `import_projects` reads)."""

    queryset = Project.objects.all()
    serializer_class = ProjectSerializer
    scopes = {action: "admin" for action in ("create", "update", "partial_update", "destroy")}
    required_permissions = {"list": ("worker.view_project",), "retrieve": ("worker.view_project",),
                            **{action: ("worker.manage_projects",) for action in scopes}}

    def perform_destroy(self, instance):
        naming = instance.limits_naming_it().first()
        if naming is not None:
            raise ValidationError({"non_field_errors": [f"the scoped limit {naming.scope} names this project: "
                                                        "change or delete that row first."]})
        instance.delete()


@extend_schema_view(list=extend_schema(parameters=[BRIEF], responses={200: brief_or_full(PauseWindowSerializer)}))
class PauseWindowViewSet(SmallTable):
    """Quiet hours: jobs in scope wait until the window ends."""

    queryset = PauseWindow.objects.all()
    serializer_class = PauseWindowSerializer
    scopes = {action: "admin" for action in ("create", "update", "partial_update", "destroy")}
    required_permissions = {"list": ("worker.view_pausewindow",), "retrieve": ("worker.view_pausewindow",),
                            "create": ("worker.add_pausewindow",), "update": ("worker.change_pausewindow",),
                            "partial_update": ("worker.change_pausewindow",),
                            "destroy": ("worker.delete_pausewindow",)}


class SettingsView(APIView):
    """The live settings row over the environment: blank fields fall back to the environment's values."""

    scopes = {"put": "admin", "patch": "admin"}
    required_permissions = {"get": ("worker.view_dispatchsettings",), "put": ("worker.manage_settings",),
                            "patch": ("worker.manage_settings",)}

    def _row(self) -> DispatchSettings:
        return DispatchSettings.objects.filter(pk=1).first() or DispatchSettings()  # never created by a read

    @extend_schema(responses={200: DispatchSettingsSerializer}, operation_id="settings_read")
    def get(self, request):
        return Response(DispatchSettingsSerializer(self._row()).data)

    def _write(self, request, partial: bool):
        row = self._row()
        serializer = DispatchSettingsSerializer(row, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        serializer.save()
        return Response(serializer.data)

    @extend_schema(request=DispatchSettingsSerializer, responses={200: DispatchSettingsSerializer},
                   operation_id="settings_replace")
    def put(self, request):
        return self._write(request, partial=False)

    @extend_schema(request=DispatchSettingsSerializer, responses={200: DispatchSettingsSerializer},
                   operation_id="settings_update")
    def patch(self, request):
        return self._write(request, partial=True)


class ReasonsView(APIView):
    """Every reason token a run can carry: what it means and what to do next (the admin's and the comments' table)."""

    required_permissions = {"get": ("worker.view_run",)}

    @extend_schema(responses={200: REASONS}, operation_id="reasons")
    def get(self, request):
        return Response(reasons.as_table())


# --- spend ------------------------------------------------------------------------------------------------------

class SpendView(APIView):
    """Today's, this week's and this month's job counts against their caps, today's tokens and cost."""

    required_permissions = {"get": ("worker.view_run",)}

    @extend_schema(responses={200: inline_serializer("Spend", {
        "windows": serializers.ListField(child=serializers.DictField()), "tokens_today": serializers.IntegerField(),
        "token_cap": serializers.IntegerField(allow_null=True),
        "cost_today": serializers.CharField(help_text="dollars, a decimal string of six places at most"),
        "caps_error": serializers.CharField(),
        "budget": serializers.ListField(child=inline_serializer("BudgetLine", {
            "ledger": serializers.CharField(help_text="jobs, tokens or dollars"), "window": serializers.CharField(),
            "scope": serializers.CharField(help_text="a scoped limit's repository or folder; empty: the deployment"),
            "used": serializers.CharField(help_text="a decimal string (dollars: six places at most)"),
            "held": serializers.CharField(), "cap": serializers.CharField(allow_null=True),
            "state": serializers.CharField()}))})},
        operation_id="spend")
    def get(self, request):
        from apps.worker.spend import budget_in_force, spend

        try:
            redis = get_redis()
            current, in_force = spend(redis), budget_in_force(redis)
        except RedisError:
            raise RedisUnavailable() from None
        return Response({
            "windows": [{"window": meter.window, "used": meter.used, "cap": meter.cap, "state": meter.state}
                        for meter in current.meters],
            "tokens_today": current.tokens_today, "token_cap": current.token_cap,
            "cost_today": money_text(current.cost_today), "caps_error": current.caps_error,
            # Every window in force on one footing (what the cost page shows): job counts, tokens, dollars.
            "budget": [{"ledger": line.ledger, "window": line.window, "scope": line.scope,
                        "used": money_text(line.used), "held": money_text(line.held), "cap": money_text(line.cap),
                        "state": line.state}
                       for line in in_force.lines],
        })
