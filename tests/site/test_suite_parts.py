"""The suite's own bookkeeping: .ci/run's PostgreSQL pass runs the modules tests/conftest.py names, so a module
renamed or removed must not silently drop out of it."""

from tests.conftest import DATABASE_SENSITIVE, ROOT


def test_every_database_sensitive_module_exists():
    assert [path for path in sorted(DATABASE_SENSITIVE) if not (ROOT / path).is_file()] == []

