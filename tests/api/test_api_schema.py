"""schemathesis against the API's own OpenAPI schema, on the real database and Redis: whatever a client sends
within (and around) the schema, no answer is a 5xx and every answer matches the schema, errors included."""

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from apps.access import tokens

pytestmark = pytest.mark.django_db(transaction=True)  # the fleet's audit rows are written on their own connection

# What the answers must be. Not "every schema-valid request is accepted": a pause `until` in the past, a
# folder that is not a repository are valid JSON and still refused, by rules a schema cannot say.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]

# Built in-process from the views (what /api/v1/schema/ serves) and called through the WSGI app itself.
schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = get_wsgi_application()


@pytest.fixture
def admin_token(settings, redis_conn):
    settings.PI_API_RATE = "100000/min"
    # As Django's test client does: the WSGI handler must not close the test's database connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    user = User.objects.create_superuser("schema-admin", password="x")
    _, token = tokens.issue(user, name="schemathesis", scope="admin")
    yield token
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@hypothesis_settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_answer_is_a_server_error_and_every_answer_matches_the_schema(case, admin_token):
    case.call_and_validate(headers={"Authorization": f"Bearer {admin_token}"}, checks=CHECKS)
