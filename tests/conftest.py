"""Shared test fixtures. The tests run against real services that `make test` starts:
a private redis-server (REDIS_URL) and a private Docker engine (DOCKER_HOST) holding the demo image.
"""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.receiver_support")  # imported here, before pytest loads it as a plugin

from django.db import connection  # noqa: E402

from tests.receiver_support import GITHUB_SECRET, github_signature  # noqa: E402

# Fixtures kept beside what they set up, offered to every test module (none imports another's fixtures).
pytest_plugins = ["tests.receiver_support", "tests.local_repos", "tests.browser_support", "tests.hosts_support"]

ROOT = Path(__file__).resolve().parent.parent
PAYLOADS = Path(__file__).resolve().parent / "payloads"
WEBHOOK_SECRET = GITHUB_SECRET  # the one GitHub secret the suite signs with
SELF_ID = "424242"
PROVIDER_KEY = "sk-test-provider-key"
# Every name a job container may see: the worker's closed list, the way out through its egress gateway (and the
# models.json that points pi at it), the bot identity its commits carry, and what Docker and the shell add.
# Never a credential: the gateway adds the provider key outside, and the worker publishes with the forge token.
CONTAINER_ENV = {"HOME", "PATH", "HOSTNAME", "PI_JOB_ID", "PI_FLOW", "PI_MAX_TURNS", "PI_PROVIDER",
                 "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy",
                 "PI_CODING_AGENT_DIR",
                 "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"}
FORGE_TOKEN_NAMES = {"GITHUB_TOKEN", "GH_TOKEN", "GITHUB_API_URL", "GITLAB_TOKEN", "GITLAB_HOST", "FORGEJO_TOKEN",
                     "FORGEJO_URL", "AZURE_DEVOPS_EXT_PAT", "SYSTEM_COLLECTIONURI"}
SHELL_OWN_ENV = {"PWD", "SHLVL", "OLDPWD", "_"}


# The modules whose code asks the database what only it can answer alike or not: PostgreSQL's own SQL (the cost
# page's GROUPING SETS, /metrics' JSON functions and its UNION with the pruned runs, the run list's estimated count,
# hand-written row statements), its locking and isolation (the inbox, deduplication, one-shot rules, trigger
# reordering under SELECT FOR UPDATE, the cron producer, housekeeping's batches under SELECT FOR UPDATE SKIP LOCKED),
# its types and ranges (the API's filters, cursors and ids; the sessions' bytea transcripts read by another host;
# the poller's cursors, GitHub's ids past 2**31), its outage (a worker losing it mid-job), the systemd units'
# processes (run as a multi-host deployment runs them, on its database), and the fleet drills, which run on it
# alone. .ci/run runs the whole suite on SQLite, then these on PostgreSQL (`-m database`): running everything twice
# bought nothing the second time but half the CI's time.
DATABASE_SENSITIVE = {
    "tests/receiver/test_receiver_inbox.py", "tests/receiver/test_receiver_dedup.py",
    "tests/receiver/test_rowwrites.py",
    "tests/receiver/test_one_shots.py", "tests/receiver/test_receiver_one_shot.py", "tests/receiver/test_cron.py",
    "tests/receiver/test_receiver_triggers.py", "tests/receiver/test_github_intake.py",
    "tests/admin/test_cost_page.py", "tests/admin/test_admin_runs.py", "tests/site/test_metrics.py",
    "tests/api/test_api.py", "tests/api/test_api_numbers.py", "tests/fleet/test_fleet_panel.py",
    "tests/worker/test_worker_database_down.py", "tests/worker/test_dollar_caps.py",
    "tests/worker/test_budget_caps.py", "tests/worker/test_doctor.py", "tests/site/test_rolling_upgrade.py",
    "tests/fleet/test_fleet_drain.py", "tests/site/test_deploy_units.py", "tests/site/test_housekeeping.py",
    "tests/worker/test_housekeeping_daily.py", "tests/worker/test_sessions.py",
    "tests/worker/test_notifications.py",  # a delivery made once (a unique constraint), its try under select_for_update
    "tests/receiver/test_github_poller.py",
}


# The modules that need no service `make test` starts (no Redis, Docker engine, PostgreSQL or browser; in-process
# stand-ins, SQLite and local git are theirs): parsing, validation, scopes, settings, forms, the forge clients, the
# admin's and the API's pages, the suite's own bookkeeping. `make check` runs them alone, with nothing started, in
# a minute or two; there Redis and Docker point where nothing listens, so a test that reaches for them fails at once.
SERVICE_FREE = {
    "tests/admin/test_admin.py", "tests/admin/test_admin_permissions.py", "tests/admin/test_admin_projects.py",
    "tests/admin/test_admin_runs.py", "tests/admin/test_admin_triggers.py",
    "tests/api/test_api_numbers.py",
    "tests/receiver/test_forge_clients.py", "tests/receiver/test_forge_credentials.py",
    "tests/receiver/test_receiver_properties.py", "tests/receiver/test_receiver_triggers.py",
    "tests/receiver/test_receiver_verification.py", "tests/receiver/test_rowwrites.py",
    "tests/receiver/test_trigger_overlay_backend.py",
    "tests/site/test_ci_failures.py", "tests/site/test_config_corpus.py", "tests/site/test_config_files.py",
    "tests/site/test_deploy_settings.py", "tests/site/test_forge_registry.py", "tests/site/test_rolling_upgrade.py",
    "tests/site/test_suite_parts.py", "tests/site/test_suite_processes.py", "tests/site/test_upgrade_script.py",
    "tests/site/test_run_lock.py", "tests/site/test_image_build_stop.py",
    "tests/worker/test_egress_proxy.py", "tests/worker/test_egress_settings.py", "tests/worker/test_exitline.py",
    "tests/worker/test_forge_comments.py", "tests/worker/test_forge_pulls.py", "tests/worker/test_forge_workspace.py",
    "tests/worker/test_publish_hostile_repo.py", "tests/worker/test_publish_work.py",
    "tests/worker/test_publishing.py", "tests/worker/test_runner.py", "tests/worker/test_scrubbing.py",
    "tests/worker/test_worker_bounds.py",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.path.relative_to(ROOT).as_posix()
        if path in DATABASE_SENSITIVE or path.startswith("tests/hosts/"):
            item.add_marker(pytest.mark.database)
        if path in SERVICE_FREE:
            item.add_marker(pytest.mark.service_free)


def pytest_configure(config):
    if not os.environ.get("PIDISPATCH_TEST_STACK"):
        pytest.exit(
            "Run the tests with `make test`: it starts the private Redis and Docker engine they use "
            "(never a shared Redis). Extra pytest arguments: make test PYTEST_ARGS='-k name'.",
            returncode=2,
        )


@pytest.fixture(autouse=True)
def _github_configured(settings, tmp_path):
    settings.GITHUB_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.GITHUB_SELF_ID = SELF_ID
    settings.PI_JOB_ROOT = tmp_path / "jobs"


@pytest.fixture
def redis_conn():
    from apps.fleet.connection import get_redis

    return get_redis()


@pytest.fixture(autouse=True)
def _audit_rows_land_in_their_own_test():
    """An operator action's audit row is written by a helper thread the action waits on for a few seconds at most
    (apps/fleet/audit.py). Under load such a thread can outlive its test and write after the test's database was
    reset: a row of the next test's. Each test waits for its own (a row its test's transaction blocks is refused by
    the database's lock timeout, not written later)."""
    yield
    for thread in threading.enumerate():
        if thread.name == "fleet-audit":
            thread.join(timeout=30)


@pytest.fixture(autouse=True)
def _empty_redis():
    """The tests' Redis is private to this run, so each test may start from an empty one (`make check` has none)."""
    if not os.environ.get("PIDISPATCH_SERVICE_FREE"):
        from apps.fleet.connection import get_redis

        get_redis().flushdb()
    yield


def load_payload(relative: str) -> bytes:
    return (PAYLOADS / relative).read_bytes()


def github_payload(labels=("bug", "pi"), body_text=None, sender_id=4410987, action="labeled") -> bytes:
    payload = json.loads(load_payload("github/issues_labeled.json"))
    payload["action"] = action
    payload["issue"]["labels"] = [{"id": i, "name": name, "color": "ededed"} for i, name in enumerate(labels)]
    if body_text is not None:
        payload["issue"]["body"] = body_text
    payload["sender"]["id"] = sender_id
    return json.dumps(payload).encode()


@pytest.fixture
def post_github(client):
    """POST a delivery to /hooks/github signed as GitHub signs it."""

    def post(body: bytes, delivery="d-1", event="issues", signature=None, **headers):
        return client.post(
            "/hooks/github",
            data=body,
            content_type="application/json",
            HTTP_X_GITHUB_EVENT=event,
            HTTP_X_GITHUB_DELIVERY=delivery,
            HTTP_X_HUB_SIGNATURE_256=github_signature(body) if signature is None else signature,
            **headers,
        )

    return post


@pytest.fixture
def label_trigger(db):
    from apps.receiver.models import Trigger

    return Trigger.objects.create(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")


def database_url(host: str = "", port: int = 0) -> str:
    """The URL of the database this test uses, so a worker subprocess writes where the test reads (a server's
    through another `host` and `port`, when given)."""
    settings_dict = connection.settings_dict
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or ""
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = host or settings_dict.get("HOST") or "127.0.0.1"
    return f"postgres://{auth}{host}:{port or settings_dict.get('PORT') or 5432}/{settings_dict['NAME']}"


@pytest.fixture
def worker_env(settings, tmp_path, github_stand_in):
    """Environment for a real `manage.py rqworker` subprocess that shares this test's database. Its GitHub
    is the local stand-in (a forge job clones a protected default branch with a token of its own, and its
    completed runs publish there: each test starts with none of the earlier tests' branches and pull requests)."""
    from tests.receiver_support import STAND_IN_TOKEN

    github_stand_in.forget_published()
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "GITHUB_SELF_ID": SELF_ID,
        "GITHUB_API_URL": github_stand_in.url,
        "GITHUB_TOKEN": STAND_IN_TOKEN,
        "PI_JOB_ROOT": str(settings.PI_JOB_ROOT),
        "PI_KEEP_JOB_DIRS": "1",
        "PI_RETRY_BACKOFF_SECONDS": "1",
        "PI_JOB_MEMORY": "256m",
        # Two cores here, two CPUs a job: the tests that run jobs side by side share the CPU time; the host budget's
        # own tests set their budgets (tests/worker/test_host_budget.py).
        "PI_HOST_CPU_BUDGET": "off",
        "PI_PROVIDER": "anthropic",
        "ANTHROPIC_API_KEY": PROVIDER_KEY,
        # The workers' daily housekeeping prunes the shared test database beside whatever a test does: only the tests
        # of it turn it on (tests/worker/test_housekeeping_daily.py).
        "PI_HOUSEKEEPING_DAILY": "false",
    }


@pytest.fixture
def run_worker(worker_env):
    """Run `python manage.py rqworker <queues> --burst` to completion, as an operator would start it."""

    def run(*queues: str, env_overrides=None, timeout=120, check=True):
        env = {**worker_env, **(env_overrides or {})}
        result = subprocess.run(
            [sys.executable, "manage.py", "rqworker", *(queues or ("pi-jobs",)), "--burst"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"worker exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    return run


def wait_for(predicate, timeout=30.0, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def joined(thread: threading.Thread, timeout: float, what: str) -> None:
    """Join a test's helper thread within a deadline, naming it if it is still running then."""
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# --- Fleet and worker-process fixtures ---------------------------------------------------------------

FAST_FLEET_ENV = {
    # Registry intervals in seconds instead of 15/90/45, so a row can expire inside a test.
    "PI_FLEET_BEAT_SECONDS": "0.5",
    "PI_FLEET_ROW_TTL_SECONDS": "4",
    "PI_FLEET_LIVE_SECONDS": "2",
    "PI_FLEET_CANCEL_ACK_SECONDS": "15",
}


@pytest.fixture
def fast_fleet(settings):
    settings.PI_FLEET_BEAT_SECONDS = 0.5
    settings.PI_FLEET_ROW_TTL_SECONDS = 4
    settings.PI_FLEET_LIVE_SECONDS = 2
    settings.PI_FLEET_ROUTE_CACHE_SECONDS = 0
    settings.PI_FLEET_CANCEL_ACK_SECONDS = 15
    return settings


class WorkerProcess:
    """A long-running `manage.py rqworker` (or `rqworker-pool`) started by a test, in its own session."""

    def __init__(self, command, env, log_path):
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 (the worker's log, closed in stop())
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        self._log.flush()
        return Path(self.log_path).read_text()

    def kill(self):
        """SIGKILL the worker's main process only (its work horse dies with it)."""
        if self.alive():
            os.kill(self.process.pid, 9)
            self.process.wait(timeout=30)

    def stop(self, timeout=30):
        """The whole process group, even when the main process was killed: nothing it started may linger."""
        try:
            os.killpg(self.process.pid, 15)
            self.process.wait(timeout=timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, 9)
        self.process.wait(timeout=30)
        self._log.close()


@pytest.fixture
def start_worker(worker_env, tmp_path):
    """Start real worker processes (`manage.py rqworker <queues>`); all are stopped when the test ends."""
    started: list[WorkerProcess] = []

    def start(*queues, env=None, pool: int = 0, name=None):
        command = [sys.executable, "manage.py", "rqworker-pool" if pool else "rqworker", *queues]
        if pool:
            command += ["--num-workers", str(pool)]
        full_env = {**worker_env, **FAST_FLEET_ENV, **(env or {})}
        worker = WorkerProcess(command, full_env, tmp_path / f"worker-{name or len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def fleet_command(worker_env):
    """`python manage.py fleet ...` as an operator runs it: its own process, this test's Redis and database."""

    def run(*args, env=None, timeout=60):
        return subprocess.run([sys.executable, "manage.py", "fleet", *args], cwd=ROOT,
                              env={**worker_env, **FAST_FLEET_ENV, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def job_containers():
    """The job containers on the test's Docker engine, by job id (removed again when the test ends)."""
    import docker

    engine = docker.from_env()

    def listing(host=None):
        filters = {"label": f"pidispatch.host={host}"} if host else {"label": "pidispatch.job"}
        return {c.labels["pidispatch.job"]: c
                for c in engine.containers.list(all=True, filters=filters, ignore_removed=True)}

    yield listing
    for leftover in listing().values():
        with contextlib.suppress(docker.errors.APIError):
            leftover.remove(force=True)
