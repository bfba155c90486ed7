"""Triggers and the delivery inbox over the API.

A trigger is read and written in the language of the ancestor's `triggers.json` (`{"on": {...}, "run": {...}}`),
validated by apps/receiver/validation.py as the importer and the admin validate it; `import` and `export` are
the importer's own (apps/receiver/triggers.py). Deliveries show ids and outcomes, never their payload;
`replay` and `discard` are the inbox's own (intake.replay, intake.discard)."""

from __future__ import annotations

import json

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from pidispatch_site.api_base import MAX_ID, StrictCursorPagination, WholeNumberIds, whole_number

from . import intake, triggerfile, triggers
from .models import Delivery, DeliveryStatus, Trigger
from .validation import entry_from_trigger, entry_problems, fields_from_entry

MANAGE, VIEW = ("receiver.manage_triggers",), ("receiver.view_trigger",)
TRIGGER_DOCUMENT = inline_serializer("Trigger", {
    "id": serializers.IntegerField(read_only=True), "position": serializers.IntegerField(),
    "enabled": serializers.BooleanField(), "note": serializers.CharField(allow_blank=True),
    "on": serializers.DictField(), "run": serializers.DictField()})
TRIGGER_WRITE = inline_serializer("TriggerWrite", {
    "on": serializers.DictField(), "run": serializers.DictField(),
    "position": serializers.IntegerField(required=False), "enabled": serializers.BooleanField(required=False),
    "note": serializers.CharField(required=False, allow_blank=True)})
EXTRA_KEYS = {"position", "enabled", "note"}


def trigger_document(trigger: Trigger) -> dict:
    return {"id": trigger.pk, "position": trigger.position, "enabled": trigger.enabled, "note": trigger.note,
            **entry_from_trigger(trigger)}


def _problems_as_errors(problems) -> dict:
    errors: dict = {}
    for problem in problems:
        errors.setdefault(problem.path or "non_field_errors", []).append(problem.message)
    return errors


def _validated(data, partial_of: Trigger | None = None) -> tuple[dict, dict]:
    """(model fields of the rule, position/enabled/note) or a 400 naming each problem."""
    if not isinstance(data, dict):
        raise ValidationError({"non_field_errors": ['a trigger is an object {"on": {...}, "run": {...}}']})
    unknown = sorted(set(data) - {"on", "run"} - EXTRA_KEYS)
    if unknown:
        raise ValidationError({name: ["unknown field"] for name in unknown})
    entry = {"on": data.get("on"), "run": data.get("run")}
    if partial_of is not None:
        current = entry_from_trigger(partial_of)
        entry = {key: entry[key] if entry[key] is not None else current[key] for key in ("on", "run")}
    problems, _ = entry_problems(entry)
    if problems:
        raise ValidationError(_problems_as_errors(problems))
    extra = {key: data[key] for key in EXTRA_KEYS if key in data}
    if "position" in extra and (not isinstance(extra["position"], int) or isinstance(extra["position"], bool)
                                or extra["position"] < 0):
        raise ValidationError({"position": ["a whole number >= 0 (rules are tried in this order)"]})
    if "enabled" in extra and not isinstance(extra["enabled"], bool):
        raise ValidationError({"enabled": ["true or false"]})
    if "note" in extra and (not isinstance(extra["note"], str) or len(extra["note"]) > 200):
        raise ValidationError({"note": ["text of at most 200 characters"]})
    return fields_from_entry(entry), extra


def _save(trigger: Trigger, fields: dict, extra: dict) -> Trigger:
    for name, value in {**fields, **extra}.items():
        setattr(trigger, name, value)
    try:
        trigger.full_clean()
    except Exception as error:  # the model's cross-rule checks (one comment rule per forge, unique cron ids)
        messages = getattr(error, "message_dict", {"non_field_errors": [str(error)]})
        raise ValidationError(messages) from None
    trigger.save()
    return trigger


@extend_schema_view(
    list=extend_schema(responses={200: TRIGGER_DOCUMENT}),
    retrieve=extend_schema(responses={200: TRIGGER_DOCUMENT}),
    create=extend_schema(request=TRIGGER_WRITE, responses={201: TRIGGER_DOCUMENT}),
    update=extend_schema(request=TRIGGER_WRITE, responses={200: TRIGGER_DOCUMENT}),
    partial_update=extend_schema(request=TRIGGER_WRITE, responses={200: TRIGGER_DOCUMENT}),
    destroy=extend_schema(responses={204: None}),
)
class TriggerViewSet(viewsets.ViewSet):
    """Triggers in file order. Writes need the admin scope and the user's permission to manage triggers."""

    WRITES = ("create", "update", "partial_update", "destroy", "enable", "disable", "import_file")
    lookup_value_regex = WholeNumberIds.lookup_value_regex
    scopes = {name: "admin" for name in WRITES}
    required_permissions = {"list": VIEW, "retrieve": VIEW, "export": VIEW, **{name: MANAGE for name in WRITES}}

    def _get(self, pk) -> Trigger:
        number = whole_number(str(pk), 1, MAX_ID)
        trigger = Trigger.objects.filter(pk=number).first() if number is not None else None
        if trigger is None:
            raise NotFound("no such trigger")
        return trigger

    def list(self, request):
        return Response([trigger_document(trigger) for trigger in Trigger.objects.order_by("position", "id")])

    def retrieve(self, request, pk=None):
        return Response(trigger_document(self._get(pk)))

    def create(self, request):
        fields, extra = _validated(request.data)
        extra.setdefault("position", (Trigger.objects.order_by("-position").values_list("position", flat=True)
                                      .first() or -1) + 1)
        return Response(trigger_document(_save(Trigger(), fields, extra)), status=status.HTTP_201_CREATED)

    def update(self, request, pk=None):
        trigger = self._get(pk)
        fields, extra = _validated(request.data)
        return Response(trigger_document(_save(trigger, fields, extra)))

    def partial_update(self, request, pk=None):
        trigger = self._get(pk)
        fields, extra = _validated(request.data, partial_of=trigger)
        return Response(trigger_document(_save(trigger, fields, extra)))

    def destroy(self, request, pk=None):
        self._get(pk).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: TRIGGER_DOCUMENT})
    @action(detail=True, methods=["post"])
    def enable(self, request, pk=None):
        trigger = self._get(pk)
        triggers.set_enabled(Trigger.objects.filter(pk=trigger.pk), True)
        return Response(trigger_document(self._get(pk)))

    @extend_schema(request=None, responses={200: TRIGGER_DOCUMENT})
    @action(detail=True, methods=["post"])
    def disable(self, request, pk=None):
        trigger = self._get(pk)
        triggers.set_enabled(Trigger.objects.filter(pk=trigger.pk), False)
        return Response(trigger_document(self._get(pk)))

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=False, methods=["get"])
    def export(self, request):
        """The table as the ancestor's `triggers.json` (what `manage.py export_triggers` writes)."""
        return Response(json.loads(triggerfile.render(triggers.export_entries())))

    @extend_schema(parameters=[OpenApiParameter("dry_run", bool, description="validate and report, change nothing")],
                   request=OpenApiTypes.OBJECT, responses={200: inline_serializer("ImportReport", {
                       "dry_run": serializers.BooleanField(), "triggers": serializers.IntegerField(),
                       "created": serializers.IntegerField(), "updated": serializers.IntegerField(),
                       "removed": serializers.IntegerField(), "warnings": serializers.ListField(
                           child=serializers.CharField())})})
    @action(detail=False, methods=["post"], url_path="import")
    def import_file(self, request):
        """Make the table equal the given `triggers.json` (a file with any problem changes nothing)."""
        try:
            parsed = triggerfile.parse(json.dumps(request.data))
        except triggerfile.TriggerFileError as error:
            raise ValidationError({"file": list(error.problems)}) from None
        dry_run = request.query_params.get("dry_run") in ("1", "true", "yes")
        report = {"dry_run": dry_run, "triggers": len(parsed.entries), "created": 0, "updated": 0, "removed": 0,
                  "warnings": list(parsed.warnings)}
        if not dry_run:
            with transaction.atomic():
                done = triggers.import_file(parsed)
            report.update(created=done.created, updated=done.updated, removed=done.removed)
        return Response(report)


class DeliverySerializer(serializers.ModelSerializer):
    holds_payload = serializers.SerializerMethodField()

    class Meta:
        model = Delivery
        exclude = ["payload"]

    def get_holds_payload(self, delivery: Delivery) -> bool:
        return delivery.payload is not None


class DeliveryPages(StrictCursorPagination):
    ordering = ("-received_at", "-id")
    page_size = 50


INBOX = ("receiver.view_delivery",)
INBOX_CHANGE = ("receiver.change_delivery",)


@extend_schema_view(list=extend_schema(parameters=[
    OpenApiParameter("status", str, enum=list(DeliveryStatus.values)), OpenApiParameter("forge", str)]))
class DeliveryViewSet(WholeNumberIds, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The inbox: every verified delivery, its outcome and job ids (never its payload)."""

    serializer_class = DeliverySerializer
    pagination_class = DeliveryPages
    scopes = {"replay": "operate", "discard": "operate"}
    required_permissions = {"list": INBOX, "retrieve": INBOX, "replay": INBOX_CHANGE, "discard": INBOX_CHANGE}

    def get_queryset(self):
        deliveries = Delivery.objects.defer("payload")
        if self.action == "list":
            query = self.request.query_params
            unknown = sorted(set(query) - {"status", "forge", "cursor", "page_size", "format"})
            if unknown:
                raise ValidationError({name: ["unknown filter"] for name in unknown})
            if "status" in query:
                if query["status"] not in DeliveryStatus.values:
                    raise ValidationError({"status": [f"one of {', '.join(DeliveryStatus.values)}"]})
                deliveries = deliveries.filter(status=query["status"])
            if "forge" in query:
                deliveries = deliveries.filter(forge=query["forge"])
        return deliveries

    @extend_schema(request=None, responses={200: inline_serializer("ReplayAnswer", {
        "replayed": serializers.BooleanField(), "status": serializers.CharField(),
        "jobs": serializers.ListField(child=serializers.CharField())})})
    @action(detail=True, methods=["post"])
    def replay(self, request, pk=None):
        delivery = Delivery.objects.filter(pk=self.get_object().pk).first()
        answer = intake.replay(delivery)
        delivery.refresh_from_db()
        return Response({"replayed": answer is not None, "status": delivery.status, "jobs": list(delivery.job_ids)})

    @extend_schema(request=None, responses={200: inline_serializer("DiscardAnswer", {
        "discarded": serializers.BooleanField(), "status": serializers.CharField()})})
    @action(detail=True, methods=["post"])
    def discard(self, request, pk=None):
        delivery = self.get_object()
        changed = intake.discard(delivery)
        delivery.refresh_from_db()
        return Response({"discarded": changed, "status": delivery.status})
