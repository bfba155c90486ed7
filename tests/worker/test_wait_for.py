"""Wait-for: real check scripts for every exit code, `after` instants, bounds, supersede, and the worker
holding a job without a record until its conditions clear."""

import json
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from rq import Queue
from rq.registry import ScheduledJobRegistry

from apps.worker.gates import hostscripts, waitfor
from apps.worker.models import Outcome, Run
from tests.conftest import ROOT
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = pytest.mark.django_db

UTC = UTC


class Check:
    """A real check script whose answer (exit code) the test sets; it records the arguments it got."""

    def __init__(self, folder, name="ci-green"):
        self.name = name
        self.answer_file = folder / f"{name}.answer"
        self.args_file = folder / f"{name}.args"
        self.path = folder / f"{name}.sh"
        self.path.write_text(f'#!/bin/sh\necho "$#:$1" >> {self.args_file}\nexit $(cat {self.answer_file})\n')
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)
        self.answer(0)

    def answer(self, code: int):
        self.answer_file.write_text(str(code))

    @property
    def calls(self):
        return self.args_file.read_text().splitlines() if self.args_file.exists() else []


@pytest.fixture
def check(settings, tmp_path):
    made = Check(tmp_path)
    settings.PI_WAIT_PROFILES = f"{made.name}:{made.path}"
    settings.PI_WAIT_INTERVAL_SECONDS = 60
    return made


def waiting(job_id, *conditions, **fields):
    return forge_spec(job_id, wait_for=tuple(conditions), **fields)


def gate(redis_conn, spec, now=None):
    return waitfor.gate(redis_conn, spec, now or datetime.now(UTC))


def test_go_lets_the_job_on_and_passes_only_the_target(redis_conn, check):
    outcome = gate(redis_conn, waiting("gh-w1", {"profile": "ci-green"}))

    assert outcome.go
    assert check.calls == ["1:acme/web#7"]
    assert not redis_conn.exists(f"{waitfor.PREFIX}:job:gh-w1")  # no hold left behind


def test_a_check_gets_the_closed_environment_of_every_host_script(redis_conn, check, monkeypatch):
    """As a secret resolver does: never the worker's keys, tokens or database."""
    names_file = check.path.parent / "env-names"
    check.path.write_text(f'#!/bin/sh\nenv | sed "s/=.*//" > {names_file}\nexit 0\n')
    for name, value in (("ANTHROPIC_API_KEY", "sk-worker-key"), ("GITHUB_TOKEN", "ghp-worker-token"),
                        ("DATABASE_URL", "postgres://worker@db/pidispatch")):
        monkeypatch.setenv(name, value)

    assert gate(redis_conn, waiting("gh-w-env", {"profile": "ci-green"})).go

    names = set(names_file.read_text().split())
    assert "PATH" in names and not names & {"ANTHROPIC_API_KEY", "GITHUB_TOKEN", "DATABASE_URL"}
    assert names <= set(hostscripts.CLOSED_ENVIRONMENT) | {"PWD", "SHLVL", "_"}  # the shell's own additions


def test_not_yet_holds_with_backoff_and_hands_its_counters_to_the_wait_note(redis_conn, check):
    """The deferral's detail is what the worker notes and `held_jobs` lists (test below, through a worker)."""
    check.answer(3)
    enqueue_spec(spec := waiting("gh-w2", {"profile": "ci-green"}))
    now = datetime.now(UTC)

    outcome = gate(redis_conn, spec, now)

    assert outcome.defer_until == now + timedelta(seconds=60)
    assert outcome.reason == "wait-for"
    assert outcome.detail == {"waitingOn": "profile ci-green", "heldSeconds": 0, "checks": 1, "faults": 0,
                              "profile": "ci-green"}
    later = gate(redis_conn, spec, now + timedelta(seconds=61))
    assert later.detail["heldSeconds"] == 61 and later.detail["checks"] == 2

    check.answer(0)
    assert gate(redis_conn, spec, now + timedelta(seconds=122)).go
    assert not redis_conn.exists(f"{waitfor.PREFIX}:job:gh-w2")


def test_never_is_refused(redis_conn, check):
    check.answer(2)
    assert gate(redis_conn, waiting("gh-w3", {"profile": "ci-green"})).refuse == "wait-refused"


def test_five_faults_in_a_row_are_unanswerable_and_not_yet_resets_the_streak(redis_conn, check, settings):
    enqueue_spec(spec := waiting("gh-w4", {"profile": "ci-green"}))
    now = datetime.now(UTC)
    for answer in (1, 1, 1, 1, 3, 7, 1, 1, 1):
        check.answer(answer)
        outcome = gate(redis_conn, spec, now)
        assert outcome.defer_until is not None, answer
    check.answer(1)
    assert gate(redis_conn, spec, now).refuse == "wait-unanswerable"


def test_a_check_that_hangs_is_a_fault(redis_conn, check, settings, tmp_path):
    settings.PI_WAIT_CHECK_TIMEOUT_SECONDS = 1
    check.path.write_text("#!/bin/sh\nsleep 30\n")

    outcome = gate(redis_conn, waiting("gh-w5", {"profile": "ci-green"}))

    assert outcome.detail["faults"] == 1


def test_bounds_expire_the_wait(redis_conn, check, settings):
    settings.PI_WAIT_MAX_CHECKS = 3
    check.answer(3)
    spec = waiting("gh-w6", {"profile": "ci-green"})
    now = datetime.now(UTC)
    assert gate(redis_conn, spec, now).defer_until
    assert gate(redis_conn, spec, now).defer_until
    assert gate(redis_conn, spec, now).refuse == "wait-expired"  # the deciding check still ran
    assert len(check.calls) == 3

    settings.PI_WAIT_MAX_CHECKS = 96
    settings.PI_WAIT_MAX_SECONDS = 3600
    other = waiting("gh-w7", {"profile": "ci-green"}, number=8)
    assert gate(redis_conn, other, now).defer_until
    assert gate(redis_conn, other, now + timedelta(seconds=3601)).refuse == "wait-expired"


def test_after_defers_to_the_instant_and_refuses_beyond_thirty_days(redis_conn, check):
    now = datetime.now(UTC)
    soon = (now + timedelta(hours=2)).replace(microsecond=0)
    assert gate(redis_conn, waiting("gh-a1", {"after": soon.isoformat()}), now).defer_until == soon
    assert gate(redis_conn, waiting("gh-a2", {"after": (now - timedelta(minutes=1)).isoformat()}, number=9), now).go
    far = (now + timedelta(days=31)).isoformat()
    assert gate(redis_conn, waiting("gh-a3", {"after": far}, number=10), now).refuse == "wait-after-beyond-max"


def test_after_then_profile_checks_only_once_the_instant_has_passed(redis_conn, check):
    now = datetime.now(UTC)
    spec = waiting("gh-a4", {"after": (now + timedelta(minutes=5)).isoformat()}, {"profile": "ci-green"})
    assert gate(redis_conn, spec, now).defer_until
    assert check.calls == []
    assert gate(redis_conn, spec, now + timedelta(minutes=6)).go
    assert len(check.calls) == 1


@pytest.mark.parametrize("conditions, reason", [
    (({"profile": "nope"},), "wait-profile-unknown"),
    (({"after": "tomorrow"},), "wait-unreadable"),
    (({"after": "2026-12-01T10:00:00"},), "wait-unreadable"),  # no zone
    (({"exclusive": True},), "wait-unreadable"),
    (({"profile": "ci-green", "after": "2026-12-01T10:00:00Z"},), "wait-unreadable"),
])
def test_conditions_the_worker_cannot_honour_are_refused(redis_conn, check, conditions, reason):
    assert gate(redis_conn, waiting("gh-u", *conditions)).refuse == reason


def test_a_profile_whose_script_is_not_executable_is_unknown(redis_conn, check):
    check.path.chmod(0o644)
    assert gate(redis_conn, waiting("gh-u2", {"profile": "ci-green"})).refuse == "wait-profile-unknown"


def test_a_second_delivery_waiting_on_the_same_conditions_is_superseded(redis_conn, check):
    check.answer(3)
    enqueue_spec(first := waiting("gh-s1", {"profile": "ci-green"}))
    assert gate(redis_conn, first).defer_until

    second = waiting("gh-s2", {"profile": "ci-green"})
    assert gate(redis_conn, second).refuse == "wait-superseded"

    different_target = waiting("gh-s3", {"profile": "ci-green"}, number=99)
    assert gate(redis_conn, different_target).defer_until  # another issue waits on its own


def test_a_dead_holder_does_not_block_a_new_delivery(redis_conn, check):
    check.answer(3)
    assert gate(redis_conn, waiting("gh-gone", {"profile": "ci-green"})).defer_until  # never enqueued: not live
    assert gate(redis_conn, waiting("gh-new", {"profile": "ci-green"})).defer_until


def test_backoff_doubles_every_ten_intervals_up_to_fifteen_minutes(settings):
    settings.PI_WAIT_INTERVAL_SECONDS = 60
    assert [waitfor.backoff_seconds(held) for held in (0, 599, 600, 1200, 1800, 2400, 99999)] == [
        60, 60, 120, 240, 480, 900, 900]


@pytest.mark.django_db(transaction=True)
def test_the_worker_holds_a_job_without_a_record_until_it_clears(check, run_worker, worker_env, redis_conn):
    check.answer(3)
    job_id = enqueue_spec(waiting("gh-held", {"profile": "ci-green"}))
    env = {"PI_WAIT_PROFILES": f"{check.name}:{check.path}", "PI_WAIT_INTERVAL_SECONDS": "60"}

    run_worker("pi-jobs", env_overrides=env)

    assert not Run.objects.filter(job_id=job_id).exists()
    queue = Queue("pi-jobs", connection=redis_conn)
    assert ScheduledJobRegistry(queue=queue).get_job_ids() == [job_id]
    (row,) = json.loads(manage(worker_env, env, "held_jobs", "--json"))
    next_look = datetime.fromisoformat(row.pop("next_look_at"))
    assert 0 <= row.pop("held_seconds") <= 60 and 50 <= (next_look - datetime.now(UTC)).total_seconds() <= 61
    assert row == {"job_id": job_id, "queue": "pi-jobs", "target": "acme/web#7", "waiting_on": "profile ci-green",
                   "checks": 1, "faults": 0, "denials": 0}
    # One view of waiting jobs: `fleet status` shows the same job, held, with the same counters.
    (shown,) = json.loads(manage(worker_env, env, "fleet", "status", "--json"))["waiting"]
    assert (shown["job_id"], shown["kind"], shown["detail"]["checks"]) == (job_id, "held", 1)

    check.answer(0)
    ScheduledJobRegistry(queue=queue).schedule(queue.fetch_job(job_id), datetime.now(UTC))  # wake it now
    time.sleep(1.1)
    run_worker("pi-jobs", env_overrides=env)

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    assert json.loads(manage(worker_env, env, "held_jobs", "--json")) == []


def manage(worker_env, env, *arguments) -> str:
    return subprocess.run([sys.executable, "manage.py", *arguments], cwd=ROOT, env={**worker_env, **env},
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.django_db(transaction=True)
def test_a_refused_wait_leaves_a_policy_record(check, run_worker):
    check.answer(2)
    job_id = enqueue_spec(waiting("gh-refused", {"profile": "ci-green"}))

    run_worker("pi-jobs", env_overrides={"PI_WAIT_PROFILES": f"{check.name}:{check.path}"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "wait-refused", False)
