"""The database down when a job is popped: before any spend that defers the job (same id, no attempt used,
nothing recorded) until the database answers; it never lands in RQ's failed registry unrecorded.

The worker reaches the test's database through a path the test can cut and restore while the worker runs:
a symlinked folder for SQLite, a TCP relay for PostgreSQL (CI runs the suite on both)."""

import contextlib
import os
import socket
import threading
from pathlib import Path

import pytest
from django.db import connection
from rq.job import Job

from apps.fleet import state
from apps.fleet.connection import text
from apps.worker.models import Outcome, Run
from tests.conftest import database_url, wait_for
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


class SqliteThroughLink:
    """The database file seen through a symlinked folder: no link, no database."""

    def __init__(self, tmp_path):
        real = Path(connection.settings_dict["NAME"])
        self.link, self.target = tmp_path / "database", real.parent
        self.url = f"sqlite:///{self.link / real.name}"
        self.restore()

    def cut(self):
        self.link.unlink()

    def restore(self):
        os.symlink(self.target, self.link)

    def close(self):
        pass


class PostgresThroughRelay:
    """The server seen through a TCP relay on a port of its own: cut, it neither accepts nor carries."""

    def __init__(self):
        settings_dict = connection.settings_dict
        self.upstream = (settings_dict.get("HOST") or "127.0.0.1", int(settings_dict.get("PORT") or 5432))
        self.listener, self.pairs, self.port = None, [], 0
        self.restore()
        self.port = self.listener.getsockname()[1]
        self.url = database_url("127.0.0.1", self.port)

    def restore(self):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            server = socket.create_connection(self.upstream)
            self.pairs.append((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def cut(self):
        for end in (self.listener, *(end for pair in self.pairs for end in pair)):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)  # wakes the accept and the pumps; close alone would not
            end.close()
        self.pairs.clear()

    def close(self):
        self.cut()


@pytest.fixture
def switchable_database(tmp_path):
    database = SqliteThroughLink(tmp_path) if connection.vendor == "sqlite" else PostgresThroughRelay()
    yield database
    database.close()


def test_a_job_popped_while_the_database_is_down_waits_for_it_and_then_runs_once(
        switchable_database, start_worker, redis_conn, fast_fleet, job_containers):
    worker = start_worker("pi-jobs", env={"DATABASE_URL": switchable_database.url, "PI_DATABASE_RECHECK_SECONDS": "1"})
    wait_for(lambda: "Listening on" in worker.output(), timeout=60, what="the worker to take work")
    # The fleet's record is restored into this Redis (apps/fleet/state.py) while the database is up: a worker that
    # could not restore it would take nothing at all.
    wait_for(lambda: text(redis_conn.get(state.RESTORED) or b"") == redis_conn.info("server")["run_id"], timeout=30,
             what="the fleet's record restored into Redis")

    switchable_database.cut()
    enqueue_spec(forge_spec("gh-db-down"), "pi-jobs")

    wait_for(lambda: worker.output().count("job_database_unavailable job=gh-db-down") >= 2, timeout=60,
             what="the job to be deferred, and deferred again while the database stays down")
    assert "job_deferred job=gh-db-down reason=database-unavailable" in worker.output()
    assert Job.fetch("gh-db-down", connection=redis_conn).get_status() in ("scheduled", "queued", "started")
    assert "job_worker_error" not in worker.output()

    switchable_database.restore()

    (run,) = wait_for(lambda: list(Run.objects.filter(job_id="gh-db-down")), timeout=60, what="the run")
    assert (run.outcome, run.attempt) == (Outcome.COMPLETED, 1)
    wait_for(lambda: Job.fetch("gh-db-down", connection=redis_conn).get_status() == "finished", timeout=15,
             what="RQ to mark it finished")
