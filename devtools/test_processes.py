"""A pytest plugin `make test` loads (`-p devtools.test_processes`): each pytest-xdist process takes its own
redis-server, Docker engine and local-folder root from PIDISPATCH_TEST_SERVICES, before Django's settings
read them. One process's `flushdb`, boot reaper or folder fixtures then never touch another's; the test
database gets its own name from pytest-django (`test-pidispatch.sqlite3_gw1`)."""

import json
import os

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and os.environ.get("PIDISPATCH_TEST_SERVICES"):
    _each = json.loads(os.environ["PIDISPATCH_TEST_SERVICES"])
    os.environ.update(_each[int(_worker[2:]) % len(_each)])
