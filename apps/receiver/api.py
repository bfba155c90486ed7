"""Triggers and the delivery inbox over the API.

A trigger is read and written in the language of the ancestor's `triggers.json` (`{"on": {...}, "run": {...}}`),
validated by apps/receiver/validation.py as the importer and the admin validate it; `import` and `export` are
the importer's own (apps/receiver/triggers.py). Deliveries show ids and outcomes, never their payload;
`replay` and `discard` are the inbox's own (intake.replay, intake.discard)."""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from pidispatch_site.api_base import (
    MAX_ID,
    BriefMode,
    NamedFieldsModelSerializer,
    QueryFilter,
    StrictCursorPagination,
    StrictSerializer,
    TextField,
    TrueFalseField,
    WholeNumberField,
    WholeNumberIds,
    brief_or_full,
    filter_list,
    filter_parameters,
    time_range,
    whole_number,
)

from . import intake, triggerfile, triggers
from .models import Delivery, DeliveryStatus, Trigger
from .validation import entry_from_trigger, entry_problems, fields_from_entry

MANAGE, VIEW = ("receiver.manage_triggers",), ("receiver.view_trigger",)
POSITION_MAX = 2**31 - 1  # the column's range (a PositiveIntegerField)


def trigger_document(trigger: Trigger) -> dict:
    return {"id": trigger.pk, "name": trigger.name, "position": trigger.position, "enabled": trigger.enabled,
            "note": trigger.note, **entry_from_trigger(trigger)}


def _problems_as_errors(problems) -> dict:
    errors: dict = {}
    for problem in problems:
        errors.setdefault(problem.path or "non_field_errors", []).append(problem.message)
    return errors


class TriggerSerializer(StrictSerializer):
    """A trigger in the language of `triggers.json` (`on` and `run` as the importer reads them, checked by
    apps/receiver/validation.py), with its name, its place in the table, its switch and the operator's note."""

    id = serializers.IntegerField(read_only=True)
    name = TextField(required=False, allow_blank=True, max_length=triggerfile.MAX_NAME, trim_whitespace=False,
                     help_text="What the operator calls it (the trigger list and its runs show it); empty: none.")
    position = WholeNumberField(required=False, min_value=0, max_value=POSITION_MAX,
                                help_text="Rules are tried in this order; a new rule goes last unless given.")
    enabled = TrueFalseField(required=False)
    note = TextField(required=False, allow_blank=True, max_length=200, trim_whitespace=False,
                     help_text="The operator's note; never shown to the agent.")
    on = serializers.DictField(help_text="When the rule fires: `type` (label, comment, cron, ...) and its keys, as "
                                         "in triggers.json.")
    run = serializers.DictField(help_text="What it runs: `kind`, `flow` or `command`, and the rest of triggers.json's "
                                          "`run` keys.")

    def to_representation(self, trigger: Trigger) -> dict:
        return trigger_document(trigger)

    def validate(self, attrs):
        entry = {"on": attrs.get("on"), "run": attrs.get("run")}
        if self.partial and self.instance is not None:  # PATCH: the rule's other half is the stored one
            current = entry_from_trigger(self.instance)
            entry = {key: entry[key] if entry[key] is not None else current[key] for key in ("on", "run")}
        problems, _ = entry_problems(entry)
        if problems:
            raise ValidationError(_problems_as_errors(problems))
        fields = fields_from_entry(entry)
        triggers.check_skills_dir_change(self.context["request"].user,
                                         self.instance.skills_dir if self.instance is not None else "",
                                         fields["skills_dir"])
        return {**fields, **{key: attrs[key] for key in ("name", "position", "enabled", "note")
                                               if key in attrs}}

    def create(self, validated_data) -> Trigger:
        validated_data.setdefault("position", (Trigger.objects.order_by("-position")
                                               .values_list("position", flat=True).first() or -1) + 1)
        return self.update(Trigger(), validated_data)

    def update(self, trigger: Trigger, validated_data) -> Trigger:
        for name, value in validated_data.items():
            setattr(trigger, name, value)
        try:
            trigger.full_clean()
        except DjangoValidationError as error:  # the model's cross-rule checks (one comment rule per forge, ...)
            raise ValidationError(error.message_dict if hasattr(error, "error_dict") else
                                  {"non_field_errors": error.messages}) from None
        trigger.save()
        return trigger


@extend_schema_view(
    list=extend_schema(responses={200: TriggerSerializer(many=True)}),
    retrieve=extend_schema(responses={200: TriggerSerializer}),
    create=extend_schema(request=TriggerSerializer, responses={201: TriggerSerializer}),
    update=extend_schema(request=TriggerSerializer, responses={200: TriggerSerializer}),
    partial_update=extend_schema(request=TriggerSerializer, responses={200: TriggerSerializer}),
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
        return Response(TriggerSerializer(Trigger.objects.order_by("position", "id"), many=True).data)

    def retrieve(self, request, pk=None):
        return Response(TriggerSerializer(self._get(pk)).data)

    def create(self, request):
        return self._write(request, None, status.HTTP_201_CREATED)

    def update(self, request, pk=None):
        return self._write(request, self._get(pk))

    def partial_update(self, request, pk=None):
        return self._write(request, self._get(pk), partial=True)

    def _write(self, request, trigger: Trigger | None, answer=status.HTTP_200_OK, partial=False):
        serializer = TriggerSerializer(trigger, data=request.data, partial=partial, context={"request": request})
        serializer.is_valid(raise_exception=True)
        serializer.save()
        return Response(serializer.data, status=answer)

    def destroy(self, request, pk=None):
        self._get(pk).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: TriggerSerializer})
    @action(detail=True, methods=["post"])
    def enable(self, request, pk=None):
        trigger = self._get(pk)
        triggers.set_enabled(Trigger.objects.filter(pk=trigger.pk), True)
        return Response(TriggerSerializer(self._get(pk)).data)

    @extend_schema(request=None, responses={200: TriggerSerializer})
    @action(detail=True, methods=["post"])
    def disable(self, request, pk=None):
        trigger = self._get(pk)
        triggers.set_enabled(Trigger.objects.filter(pk=trigger.pk), False)
        return Response(TriggerSerializer(self._get(pk)).data)

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
        if dry_run:
            triggers.check_import(parsed, request.user)
        else:
            with transaction.atomic():
                done = triggers.import_file(parsed, by=request.user)
            report.update(created=done.created, updated=done.updated, removed=done.removed)
        return Response(report)


class DeliverySerializer(NamedFieldsModelSerializer):
    """A verified delivery in the inbox: its ids, outcome and job ids, never its payload."""

    holds_payload = serializers.SerializerMethodField(
        help_text="Whether the payload is kept (its text never is shown).")

    class Meta:
        model = Delivery
        # Named, never "__all__" or an exclude: the payload holds issue text and logins (the PII rule).
        fields = ["id", "forge", "delivery_id", "event", "received_at", "processed_at", "status", "reason", "job_ids",
                  "attempts", "attempted_at", "next_attempt_at", "holds_payload"]
        brief_fields = ["id", "forge", "delivery_id", "status", "reason", "job_ids", "received_at"]

    def get_holds_payload(self, delivery: Delivery) -> bool:
        return delivery.payload is not None


class DeliveryPages(StrictCursorPagination):
    ordering = ("-received_at", "-id")
    page_size = 50


INBOX = ("receiver.view_delivery",)
INBOX_CHANGE = ("receiver.change_delivery",)


DELIVERY_FILTERS = [
    QueryFilter("status", "status", "any of these statuses", choices=tuple(DeliveryStatus.values)),
    *(QueryFilter(name, name, f"any of these {name} values") for name in ("forge", "event", "reason",
                                                                          "delivery_id")),
    *time_range("received_at", "received"), *time_range("processed_at", "processed"),
]


@extend_schema_view(list=extend_schema(parameters=filter_parameters(DELIVERY_FILTERS),
                                       responses={200: brief_or_full(DeliverySerializer)}))
class DeliveryViewSet(BriefMode, WholeNumberIds, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                      viewsets.GenericViewSet):
    """The inbox: every verified delivery, its outcome and job ids (never its payload)."""

    serializer_class = DeliverySerializer
    pagination_class = DeliveryPages
    scopes = {"replay": "operate", "discard": "operate"}
    required_permissions = {"list": INBOX, "retrieve": INBOX, "replay": INBOX_CHANGE, "discard": INBOX_CHANGE}

    def get_queryset(self):
        deliveries = Delivery.objects.defer("payload")
        if self.action == "list":
            return filter_list(deliveries, self.request.query_params, DELIVERY_FILTERS)
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
