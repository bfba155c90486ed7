"""What every API view builds on: serializers that refuse unknown fields, and cursor pages whose page size
is checked (a size that is not a number from 1 to the maximum is refused, not quietly replaced)."""

from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination


class StrictSerializer(serializers.Serializer):
    """Unknown fields are refused, not ignored (a typo must not silently change what happens)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise ValidationError({name: ["unknown field"] for name in unknown})
        return super().to_internal_value(data)


class StrictCursorPagination(CursorPagination):
    page_size_query_param = "page_size"
    max_page_size = 200

    def get_page_size(self, request):
        raw = request.query_params.getlist(self.page_size_query_param)
        if not raw:
            return self.page_size
        if len(raw) > 1 or not raw[0].isdigit() or not 1 <= int(raw[0]) <= self.max_page_size:
            raise ValidationError({self.page_size_query_param: [
                f"a whole number from 1 to {self.max_page_size}, given once (example: page_size=50)"]})
        return int(raw[0])

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
