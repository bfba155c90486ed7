"""GET /healthz: 200 when the database and Redis both answer, else 503 naming what is down."""

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET
from redis.exceptions import RedisError

from apps.fleet.connection import get_redis


@require_GET
def healthz(request):
    status = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        status["db"] = "ok"
    except Exception:  # any driver error means "down"
        status["db"] = "down"
    try:
        get_redis().ping()
        status["redis"] = "ok"
    except RedisError:
        status["redis"] = "down"
    healthy = all(value == "ok" for value in status.values())
    return JsonResponse(status, status=200 if healthy else 503)
