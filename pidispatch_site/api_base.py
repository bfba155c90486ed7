"""What every API view builds on: serializers that refuse unknown fields, cursor pages whose page size is checked
(a size that is not a number from 1 to the maximum is refused, not quietly replaced), and numbers read from a
query or a path as ASCII digits within range (`whole_number`: anything else is a 400 for a filter, a 404 for an id,
never the database's overflow as a 500)."""

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
