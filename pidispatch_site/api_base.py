"""What every API view builds on: serializers that refuse unknown fields, cursor pages whose page size is checked
(a size that is not a number from 1 to the maximum is refused, not quietly replaced), and numbers read from a
query or a path as ASCII digits within range (`whole_number`: anything else is a 400 for a filter, a 404 for an id,
never the database's overflow as a 500); money as a decimal string of six places at most; NetBox's brief mode
(`?brief=true`: a list's small representation, the serializer's `Meta.brief_fields`); and list filters declared
once (`QueryFilter`), which both filter the queryset and write the schema's parameters."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from django.db import models
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination

MAX_ID = 2**63 - 1  # the largest id the database holds (a signed 64-bit integer, SQLite's and PostgreSQL's bigint)


def whole_number(text: str, low: int, high: int) -> int | None:
    """`text` as a number when it is ASCII digits only and within [low, high]; None otherwise. (`str.isdigit` and
    `int` also take superscripts, other scripts' digits, signs, underscores and spaces, and `int` raises on some.)"""
    if not text or not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > len(str(high)):
        return None
    value = int(text)
    return value if low <= value <= high else None


class WholeNumberIds:
    """A viewset whose detail routes take ASCII digits only, and answer 404 for an id past the database's range."""

    lookup_value_regex = "[0-9]+"

    def get_object(self):
        if whole_number(self.kwargs[self.lookup_url_kwarg or self.lookup_field], 1, MAX_ID) is None:
            raise NotFound()
        return super().get_object()


class StrictSerializer(serializers.Serializer):
    """Unknown fields are refused, not ignored (a typo must not silently change what happens)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)


class TextField(serializers.CharField):
    """A text, never a number or a boolean turned into one (DRF's CharField coerces them)."""

    default_error_messages = {"not_text": "Must be a text."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_text")
        return super().to_internal_value(data)


class WholeNumberField(serializers.IntegerField):
    """A JSON number without a fraction, never a text or a boolean turned into one (DRF's IntegerField takes "5",
    5.0 and true)."""

    default_error_messages = {"not_whole": "Must be a whole number."}

    def to_internal_value(self, data):
        if not isinstance(data, int) or isinstance(data, bool):
            self.fail("not_whole")
        return super().to_internal_value(data)


class TrueFalseField(serializers.BooleanField):
    """true or false, never "yes", 1 or "on" (DRF's BooleanField takes them)."""

    default_error_messages = {"not_true_false": "Must be true or false."}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("not_true_false")
        return data


class StrictCursorPagination(CursorPagination):
    page_size_query_param = "page_size"
    max_page_size = 200

    def get_page_size(self, request):
        raw = request.query_params.getlist(self.page_size_query_param)
        if not raw:
            return self.page_size
        size = whole_number(raw[0], 1, self.max_page_size) if len(raw) == 1 else None
        if size is None:
            raise ValidationError({self.page_size_query_param: [
                f"a whole number from 1 to {self.max_page_size}, given once (example: page_size=50)"]})
        return size

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound:  # DRF answers a garbled cursor 404; it is a bad request, the list exists
            raise ValidationError({self.cursor_query_param: [
                "not a cursor this list gave out: follow the `next` or `previous` link"]}) from None

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
        return parameters


# --- money ------------------------------------------------------------------------------------------------------

MONEY_PLACES = 6


def money_text(value) -> str | None:
    """Dollars as the API writes them: a decimal string of at most six places, no trailing zeros, never an exponent
    (`0.0252`, `12.5`, `0`; a database's sum may carry 16 places and an exponent)."""
    if value is None:
        return None
    amount = Decimal(str(value)).quantize(Decimal(1).scaleb(-MONEY_PLACES), ROUND_HALF_UP)
    text = f"{amount:f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return "0" if text in ("-0", "") else text


class MoneyField(serializers.DecimalField):
    """A decimal column written as `money_text` writes it (every DecimalField of a model serializer here is one)."""

    def __init__(self, max_digits=14, decimal_places=MONEY_PLACES, **kwargs):
        super().__init__(max_digits, min(decimal_places, MONEY_PLACES), **kwargs)

    def to_representation(self, value):
        return money_text(value)


class NamedFieldsModelSerializer(serializers.ModelSerializer):
    """A model serializer whose `Meta.fields` is a list of names (a new column is never public by default: the
    PII rule), decimals written as money, and the brief representation of a list (`Meta.brief_fields`)."""

    serializer_field_mapping = {**serializers.ModelSerializer.serializer_field_mapping, models.DecimalField: MoneyField}

    def __init__(self, *args, brief: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if brief:
            for name in set(self.fields) - set(self.Meta.brief_fields):
                self.fields.pop(name)


# --- brief mode -------------------------------------------------------------------------------------------------

BRIEF = OpenApiParameter("brief", OpenApiTypes.BOOL, description="true: each item's small representation (NetBox's "
                         "brief mode: the fields of the item's `...Brief` schema, no ledgers); false or absent: the "
                         "whole record")


@functools.cache
def brief_serializer(full: type[NamedFieldsModelSerializer]) -> type[NamedFieldsModelSerializer]:
    """The brief form of a serializer as a class of its own, for the schema (its component is `<Name>Brief`)."""
    meta = type("Meta", (full.Meta,), {"fields": list(full.Meta.brief_fields)})
    name = full.__name__.removesuffix("Serializer") + "BriefSerializer"
    doc = f"{full.__name__.removesuffix('Serializer')} in brief (`?brief=true`): {', '.join(full.Meta.brief_fields)}."
    return type(name, (full,), {"Meta": meta, "__module__": full.__module__, "__doc__": doc})


def brief_or_full(full: type[NamedFieldsModelSerializer]) -> PolymorphicProxySerializer:
    """A list's items in the schema: the whole record, or with `?brief=true` the brief one (closed to other
    properties by `close_brief_components`)."""
    return PolymorphicProxySerializer(component_name=full.__name__.removesuffix("Serializer") + "OrBrief",
                                      serializers=[full, brief_serializer(full)], resource_type_field_name=None,
                                      many=True)


def close_brief_components(result, generator, request, public):
    """drf-spectacular postprocessing hook: a brief component holds its properties and no others, and a list item
    is any of the two forms (`anyOf`: a brief item may also be a whole record whose other fields are optional)."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Brief") and component.get("type") == "object":
            component["additionalProperties"] = False
        if name.endswith("OrBrief") and "oneOf" in component:
            component["anyOf"] = component.pop("oneOf")
    return result


class BriefMode:
    """A viewset whose list answers `?brief=true` with each item's `Meta.brief_fields` only."""

    def brief(self) -> bool:
        values = self.request.query_params.getlist("brief")
        if not values:
            return False
        if len(values) != 1 or values[0] not in ("true", "false"):
            raise ValidationError({"brief": ["true or false, given once (example: brief=true)"]})
        return values[0] == "true"

    def get_serializer(self, *args, **kwargs):
        if getattr(self, "action", None) == "list" and self.brief():
            kwargs["brief"] = True
        return super().get_serializer(*args, **kwargs)


# --- list filters -----------------------------------------------------------------------------------------------

def instant(name: str, text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ValidationError({name: ["an ISO 8601 instant with a zone, e.g. 2026-12-01T00:00:00Z"]})
    return moment


def any_text(name: str, text: str) -> str:
    return text


def record_id(name: str, text: str) -> int:
    number = whole_number(text, 1, MAX_ID)
    if number is None:
        raise ValidationError({name: ["an id: ASCII digits, at least 1"]})
    return number


@dataclass(frozen=True)
class QueryFilter:
    """One query parameter of a list: the lookup it filters by, how a value is read, and whether it may repeat
    (`outcome=failed&outcome=policy`: any of them). `choices` refuses any other value."""

    name: str
    lookup: str
    description: str
    read: Callable[[str, str], object] = any_text
    many: bool = True
    choices: tuple[str, ...] = ()
    kind: object = str
    extra: dict = field(default_factory=dict)

    def values(self, query) -> list:
        raw = query.getlist(self.name)
        if len(raw) > 1 and not self.many:
            raise ValidationError({self.name: ["given once"]})
        if self.choices and any(value not in self.choices for value in raw):
            raise ValidationError({self.name: [f"one of {', '.join(self.choices)}"]})
        return [self.read(self.name, value) for value in raw]

    def parameter(self) -> OpenApiParameter:
        if self.choices:
            return OpenApiParameter(self.name, str, enum=list(self.choices), many=self.many or None,
                                    explode=True if self.many else None, description=self.description)
        return OpenApiParameter(self.name, self.kind, many=self.many or None, explode=True if self.many else None,
                                description=self.description)


def time_range(column: str, what: str) -> list[QueryFilter]:
    """NetBox's lookups on a time column: `<column>__gte`, `__gt`, `__lte`, `__lt` (ISO 8601 with a zone)."""
    return [QueryFilter(f"{column}__{lookup}", f"{column}__{lookup}", f"{what} {words} (ISO 8601 with a zone)",
                        instant, many=False, kind=OpenApiTypes.DATETIME)
            for lookup, words in (("gte", "at or after"), ("gt", "after"), ("lte", "at or before"), ("lt", "before"))]


LIST_PARAMETERS = {"cursor", "page_size", "format", "brief"}


def filter_list(queryset, query, filters: list[QueryFilter]):
    """The queryset narrowed by the query's filters (each repeated value: any of them); a parameter no filter or
    page knows is a 400, not ignored (a typo must not widen the answer)."""
    known = {each.name for each in filters} | LIST_PARAMETERS
    unknown = sorted(set(query) - known)
    if unknown:
        raise ValidationError({name: ["unknown filter"] for name in unknown})
    for each in filters:
        values = each.values(query)
        if not values:
            continue
        if len(values) == 1:
            queryset = queryset.filter(**{each.lookup: values[0]})
        else:
            queryset = queryset.filter(**{f"{each.lookup}__in": values})
    return queryset


def filter_parameters(filters: list[QueryFilter]) -> list[OpenApiParameter]:
    return [each.parameter() for each in filters] + [BRIEF]
