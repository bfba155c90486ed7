"""The suite's own bookkeeping: .ci/run's PostgreSQL pass and `make check` run the modules tests/conftest.py names,
so a module renamed or removed must not silently drop out of them."""

from tests.conftest import DATABASE_SENSITIVE, ROOT, SERVICE_FREE


def test_every_database_sensitive_module_exists():
    assert [path for path in sorted(DATABASE_SENSITIVE) if not (ROOT / path).is_file()] == []


def test_every_service_free_module_exists():
    assert [path for path in sorted(SERVICE_FREE) if not (ROOT / path).is_file()] == []

