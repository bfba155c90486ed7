"""API benchmark, beside its baseline in the same run (not part of CI):

the runs list (`GET /api/v1/runs`: token authentication, scope and permission check, the Redis throttle,
filters, the whole record with its usage ledger and publish outcome) on its first page and on a deep cursor
page (half a million rows in), with 1,000,000 run rows in PostgreSQL, against a bare DRF list of the same
table (a ModelSerializer of every field, the same cursor ordering, no authentication, no throttle);
target: p99 under 50 ms and within 1.5x the bare list.

    .venv/bin/python bench/api.py [--runs 1000000] [--repeat 200] [--database-url postgres://...]

Without --database-url it starts a private Redis and a throwaway PostgreSQL cluster (as bench/fleet.py does)
and removes both at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402


def percentiles(function, repeat: int) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    samples = harness.samples_ms(function, repeat)
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def report(name: str, measured, baseline) -> bool:
    ratio = measured[1] / baseline[1] if baseline[1] else float("inf")
    ok = measured[1] < 50 and ratio <= 1.5
    print(f"{name:<40} p50 {measured[0]:7.2f} ms  p99 {measured[1]:7.2f} ms")
    print(f"{'  baseline: bare DRF list':<40} p50 {baseline[0]:7.2f} ms  p99 {baseline[1]:7.2f} ms")
    print(f"{'  ratio (p99)':<40} {ratio:7.2f}x   target p99 < 50 ms, <= 1.5x: {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--database-url", help="a PostgreSQL URL to use (its database is created/reused)")
    args = parser.parse_args()

    with harness.private_services(args.database_url, DJANGO_ALLOWED_HOSTS="testserver", PI_API_RATE="1000000/min"):
        return run(args)


def run(args) -> int:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from rest_framework import generics, serializers
    from rest_framework.pagination import Cursor, CursorPagination
    from rest_framework.permissions import AllowAny
    from rest_framework.test import APIRequestFactory

    from apps.access import tokens
    from apps.worker.api import NewestFirst, RunSerializer, RunViewSet
    from apps.worker.models import Run

    harness.migrated_database()
    harness.seed_runs(args.runs)

    class BareRunSerializer(serializers.ModelSerializer):
        class Meta:
            model = Run
            # The API's columns, without its computed fields: what a bare list of the table costs.
            fields = [name for name in RunSerializer.Meta.fields if name in {f.name for f in Run._meta.fields}]

    class BarePages(CursorPagination):
        ordering = ("-started_at", "-id")
        page_size = NewestFirst().page_size if hasattr(NewestFirst, "page_size") else 50

    class BareRunList(generics.ListAPIView):
        queryset = Run.objects.all()
        serializer_class = BareRunSerializer
        pagination_class = BarePages
        authentication_classes = ()
        permission_classes = (AllowAny,)
        throttle_classes = ()

    from django.conf import settings

    BarePages.page_size = settings.PI_API_PAGE_SIZE
    User.objects.filter(username="bench").delete()
    user = User.objects.create_superuser("bench", password="bench-password-long")
    _, token = tokens.issue(user, name="bench", scope="read")
    factory = APIRequestFactory()
    api_view = RunViewSet.as_view({"get": "list"})
    bare_view = BareRunList.as_view()

    deep_row = Run.objects.order_by("-started_at", "-id").values_list("started_at", flat=True)[args.runs // 2]
    paginator = NewestFirst()
    paginator.base_url = "http://testserver/api/v1/runs"
    paginator.cursor_query_param = "cursor"
    deep_cursor = parse_qs(urlparse(paginator.encode_cursor(Cursor(0, False, str(deep_row)))).query)["cursor"][0]

    def get(view, query, auth):
        request = factory.get("/api/v1/runs", query, **({"HTTP_AUTHORIZATION": f"Bearer {token}"} if auth else {}))
        response = view(request)
        response.render()
        assert response.status_code == 200 and len(response.data["results"]) == settings.PI_API_PAGE_SIZE, \
            response.status_code
        return response

    for query in ({}, {"cursor": deep_cursor}):  # warm up, and check both lists show the same rows
        mine = [row["id"] for row in get(api_view, query, True).data["results"]]
        bare = [row["id"] for row in get(bare_view, query, False).data["results"]]
        assert mine == bare, "the two lists disagree"

    print(f"\n{args.runs:,} run rows (PostgreSQL), page size {settings.PI_API_PAGE_SIZE}, "
          f"{args.repeat} requests each\n")
    ok = True
    for name, query in (("runs list, first page", {}), ("runs list, deep cursor page", {"cursor": deep_cursor})):
        measured = percentiles(lambda query=query: get(api_view, query, True), args.repeat)
        baseline = percentiles(lambda query=query: get(bare_view, query, False), args.repeat)
        ok &= report(name, measured, baseline)
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
