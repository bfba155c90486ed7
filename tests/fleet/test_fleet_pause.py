"""Pause and resume per queue, per host and over the queue union, from `manage.py fleet`: durable flags
with who/when/note/until, an audit row, exact answers on partial failure, a degraded registry that never
shrinks the union, and a stop switch that needs nothing but Redis."""

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rq import Queue

from apps.fleet import pauses, registry
from apps.fleet.models import FleetAction
from apps.fleet.union import LAST_UNION, queue_union

pytestmark = [pytest.mark.django_db(transaction=True)]

BROKEN_DB = {"DATABASE_URL": "postgres://nobody@127.0.0.1:1/nothing"}
BROKEN_FORGE = {"GITHUB_WEBHOOK_SECRET": "", "GITHUB_SELF_ID": "not-a-number"}


def publish(redis_conn, name, declared=True):
    registry.publish(redis_conn, registry.HostFacts(name=name, declared=declared, version="1", image="img"),
                     registry.ProcessFacts(worker_name=f"w-{name}", pid=1, proc="x/y/1/1", started_at=time.time()))


def flags(redis_conn):
    return pauses.read_flags(redis_conn)


def test_pause_and_resume_one_queue_with_who_when_note_and_an_audit_row(redis_conn, fleet_command):
    until = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)

    paused = fleet_command("pause", "--queue", "pi-jobs", "--note", "deploy 4.2", "--until", until.isoformat(),
                           "--by", "alice")

    assert paused.returncode == 0, paused.stderr
    assert ("paused 1 queue(s): pi-jobs" in paused.stdout
            and f"resumes by itself at {until.isoformat()}" in paused.stdout)
    flag = flags(redis_conn)["pi-jobs"]
    assert (flag.by, flag.note, flag.until) == ("alice", "deploy 4.2", until)
    assert timezone.now() - flag.at < timedelta(minutes=1)
    action = FleetAction.objects.get()
    assert (action.action, action.actor, action.queues, action.note, action.until) == \
        ("pause", "alice", ["pi-jobs"], "deploy 4.2", until)

    resumed = fleet_command("resume", "--queue", "pi-jobs", "--by", "bob")

    assert resumed.returncode == 0 and "resumed 1 queue(s): pi-jobs" in resumed.stdout
    assert flags(redis_conn) == {}
    assert FleetAction.objects.filter(action="resume", actor="bob").exists()


def test_a_host_pause_is_its_host_queue(redis_conn, fleet_command):
    assert fleet_command("pause", "--host", "hostA").returncode == 0
    assert set(flags(redis_conn)) == {"pi-jobs@hostA"}
    again = fleet_command("resume", "--host", "hostB")
    assert "resumed 0 queue(s): none; not paused, so left as they were: pi-jobs@hostB" in again.stdout


def test_all_is_the_queue_union(redis_conn, fleet_command):
    publish(redis_conn, "live1")                       # a declared host with a live row
    publish(redis_conn, "undeclared", declared=False)  # publishes a row but has no queue
    Queue("pi-jobs@existing", connection=redis_conn).enqueue_call("tests.jobfuncs.defer_once", args=(1,))
    redis_conn.sadd(pauses.INDEX, "pi-jobs@flagged")   # a pause flag whose host is long gone
    redis_conn.hset(pauses.flag_key("pi-jobs@flagged"), mapping={"by": "x", "at": timezone.now().isoformat()})

    result = fleet_command("pause", "--all", "--note", "n")

    assert result.returncode == 0, result.stderr
    assert set(flags(redis_conn)) == {"pi-jobs", "pi-jobs@live1", "pi-jobs@existing", "pi-jobs@flagged"}
    assert "paused 3 queue(s)" in result.stdout and "degraded" not in result.stdout
    assert "already paused, so left as they were (their note and auto-resume time kept): pi-jobs@flagged" \
        in result.stdout


def test_an_unreadable_registry_keeps_the_last_known_union_and_says_so(redis_conn, fleet_command):
    publish(redis_conn, "hostB")
    assert "pi-jobs@hostB" in queue_union(redis_conn).queues  # read whole once: remembered
    redis_conn.delete(registry.INDEX)
    redis_conn.set(registry.INDEX, "corrupted")

    result = fleet_command("pause", "--all")

    assert result.returncode == 0, result.stderr
    assert set(flags(redis_conn)) == {"pi-jobs", "pi-jobs@hostB"}  # never a silent shrink to pi-jobs
    assert "fleet view degraded: host registry unreadable" in result.stdout and "last seen" in result.stdout
    status = json.loads(fleet_command("status", "--json").stdout)
    assert status["degraded"].startswith("host registry unreadable") and status["hosts"] is None
    assert {q["name"] for q in status["queues"]} == {"pi-jobs", "pi-jobs@hostB"}


def test_a_partial_failure_names_what_changed_and_what_did_not(redis_conn, fleet_command):
    publish(redis_conn, "hostA")
    publish(redis_conn, "hostB")
    redis_conn.set(pauses.flag_key("pi-jobs@hostB"), "a key of the wrong type")

    result = fleet_command("pause", "--all")

    assert result.returncode != 0
    assert "paused pi-jobs, pi-jobs@hostA but FAILED at pi-jobs@hostB (WRONGTYPE)" in result.stderr
    assert "half paused" in result.stderr
    assert "FAILED at pi-jobs@hostB" in FleetAction.objects.get().outcome
    shown = flags(redis_conn)
    assert shown["pi-jobs"].by.startswith("cli:") and shown["pi-jobs@hostA"].by.startswith("cli:")
    assert "pause flag unreadable (WRONGTYPE)" in shown["pi-jobs@hostB"].note  # shown, and counted as paused

    fixed = fleet_command("resume", "--queue", "pi-jobs@hostB")

    assert fixed.returncode == 0 and "pi-jobs@hostB" not in flags(redis_conn)


def test_the_stop_switch_needs_only_redis(redis_conn, fleet_command):
    env = {**BROKEN_DB, **BROKEN_FORGE}

    paused = fleet_command("pause", "--all", env=env)
    status = fleet_command("status", env=env)
    resumed = fleet_command("resume", "--all", env=env)

    assert paused.returncode == 0, paused.stderr
    assert "paused 1 queue(s): pi-jobs" in paused.stdout
    assert "the audit row could not be written (database error OperationalError)" in paused.stderr
    assert status.returncode == 0 and "fleet PAUSED" in status.stdout
    assert resumed.returncode == 0 and flags(redis_conn) == {}


def test_an_unreachable_redis_says_so_and_changes_nothing(fleet_command):
    result = fleet_command("pause", "--all", env={"REDIS_URL": "redis://:secret@127.0.0.1:1/0"})

    assert result.returncode != 0
    assert "could not reach Redis at redis://127.0.0.1:1/0" in result.stderr and "Nothing was changed" in result.stderr
    assert "secret" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (("pause",), "one of the arguments --queue --host --all is required"),
    (("pause", "--queue", "default"), "'default' is not a pidispatch queue"),
    (("pause", "--host", "bad/name"), "invalid worker name 'bad/name'"),
    (("pause", "--all", "--until", "tomorrow"), "is not an ISO 8601 time"),
    (("pause", "--all", "--until", "2030-01-01T00:00:00"), "has no time zone"),
    (("pause", "--all", "--until", "2001-01-01T00:00:00Z"), "is not in the future"),
])
def test_bad_input_is_refused_with_a_clear_error_and_changes_nothing(redis_conn, fleet_command, args, message):
    result = fleet_command(*args)

    assert result.returncode != 0
    assert message in result.stderr
    assert flags(redis_conn) == {}


def test_an_expired_pause_is_cleared_by_the_next_reader(redis_conn):
    pauses.pause(redis_conn, ["pi-jobs"], by="t", until=timezone.now() + timedelta(seconds=1))
    assert "pi-jobs" in flags(redis_conn)
    time.sleep(1.2)

    assert pauses.paused_among(redis_conn, ["pi-jobs"]) == set()
    assert flags(redis_conn) == {} and not redis_conn.sismember(pauses.INDEX, "pi-jobs")
    assert FleetAction.objects.filter(action="auto-resume", actor="auto-resume").exists()


def test_a_new_pause_is_not_cleared_by_the_old_pauses_expiry(redis_conn):
    old_until = timezone.now() + timedelta(seconds=1)
    pauses.pause(redis_conn, ["pi-jobs"], by="t", until=old_until)
    seen = pauses.read_flags(redis_conn)["pi-jobs"]
    time.sleep(1.1)
    # A reader saw the old pause, which has ended by now; before it clears the flag, a new pause (no end) is set.
    pauses.pause(redis_conn, ["pi-jobs"], by="t", note="longer")

    assert redis_conn.eval(pauses._EXPIRE_IF_UNCHANGED, 2, pauses.flag_key("pi-jobs"), pauses.INDEX,
                           seen.until.isoformat(), "pi-jobs") == 0
    assert flags(redis_conn)["pi-jobs"].note == "longer"


def test_status_lists_every_queue_and_host_in_text(redis_conn, fleet_command):
    publish(redis_conn, "hostA")
    pauses.pause(redis_conn, ["pi-jobs@hostA"], by="carol", note="swap disk")

    # Live for a minute: the command's own start may take seconds on a loaded machine.
    text = fleet_command("status", env={"PI_FLEET_LIVE_SECONDS": "60"}).stdout

    assert text.startswith("fleet PART PAUSED: 2 queue(s), 1 paused")
    assert "pi-jobs@hostA  paused" in text and "carol" in text and "swap disk" in text
    assert "hostA  live" in text
    assert redis_conn.exists(LAST_UNION)


def test_pausing_a_paused_queue_keeps_its_note_and_auto_resume_time(redis_conn):
    until = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    pauses.pause(redis_conn, ["pi-jobs"], by="alice", note="deploy 4.2", until=until)

    again = pauses.pause(redis_conn, ["pi-jobs", "pi-jobs@hostA"], by="bob", note="freeze")

    assert (again.changed, again.unchanged) == (["pi-jobs@hostA"], ["pi-jobs"])
    assert "already paused, so left as they were (their note and auto-resume time kept): pi-jobs" in again.summary()
    first, second = flags(redis_conn)["pi-jobs"], flags(redis_conn)["pi-jobs@hostA"]
    assert (first.by, first.note, first.until) == ("alice", "deploy 4.2", until)
    assert (second.by, second.note, second.until) == ("bob", "freeze", None)
    assert sorted(FleetAction.objects.filter(action="pause").values_list("actor", "queues")) == [
        ("alice", ["pi-jobs"]), ("bob", ["pi-jobs@hostA"])]  # the audit names only what changed


def test_a_pause_past_its_auto_resume_time_is_replaced_by_a_new_one(redis_conn):
    redis_conn.hset(pauses.flag_key("pi-jobs"), mapping={
        "by": "alice", "at": (timezone.now() - timedelta(hours=3)).isoformat(), "note": "old",
        "until": (timezone.now() - timedelta(minutes=1)).isoformat()})
    redis_conn.sadd(pauses.INDEX, "pi-jobs")

    result = pauses.pause(redis_conn, ["pi-jobs"], by="bob", note="new")

    assert result.changed == ["pi-jobs"]
    flag = flags(redis_conn)["pi-jobs"]
    assert (flag.by, flag.note, flag.until) == ("bob", "new", None)


def test_status_into_a_pipe_whose_reader_left_ends_without_a_traceback(redis_conn, worker_env):
    """`fleet status | head`: head reads what it shows and exits; the rest of the answer must go quietly."""
    import subprocess
    import sys

    from tests.conftest import FAST_FLEET_ENV, ROOT

    for index in range(40):
        publish(redis_conn, f"host{index:02d}")
    for arguments in (["status"], ["status", "--json"]):
        process = subprocess.Popen([sys.executable, "manage.py", "fleet", *arguments], cwd=ROOT,
                                   env={**worker_env, **FAST_FLEET_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process.stdout.close()  # the reader is gone before the first line is written
        _, errors = process.communicate(timeout=60)

        assert "Traceback" not in errors.decode() and "BrokenPipeError" not in errors.decode(), errors.decode()
        assert process.returncode == 0
