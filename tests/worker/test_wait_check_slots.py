"""Wait checks, bounded: PI_WAIT_CHECK_SLOTS at once per host and, for declared hosts, fleet-wide. A job
denied a slot is throttled (deferred, its denials counted on its hold, one alarm line at the fifth), refused
only past its maximum wait; every exit of the gate leaves the slots free."""

import json
import re
import stat
from datetime import UTC, datetime, timedelta

import pytest
from rq import Queue

from apps.fleet import registry
from apps.fleet.hosts import this_host
from apps.worker.gates import host_slots, hostscripts, leases, wait_slots, waitfor
from apps.worker.models import Outcome, Run
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec

UTC = UTC
PROFILE = "slow"


class SlowCheck:
    """A real check script that records when it starts and ends (per target), takes `seconds`, and answers
    go; a target in `hold_targets` also waits for the test to open its gate first."""

    def __init__(self, folder, seconds=1.0, hold_targets=(), answer=0):
        self.log = folder / "checks.log"
        self.gate = folder / "open"
        self.path = folder / "slow-check.sh"
        holds = " ".join(f'"{target}"' for target in hold_targets) or '""'
        self.path.write_text(
            "#!/bin/sh\n"
            f'echo "start $1 $(date +%s.%N)" >> {self.log}\n'
            f'for held in {holds}; do [ "$1" = "$held" ] && while [ ! -e {self.gate} ]; do sleep 0.1; done; done\n'
            f"sleep {seconds}\n"
            f'echo "end $1 $(date +%s.%N)" >> {self.log}\n'
            f"exit {answer}\n"
        )
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    @property
    def profiles(self) -> str:
        return f"{PROFILE}:{self.path}"

    def intervals(self) -> list[tuple[float, float, str]]:
        starts, spans = {}, []
        for line in self.log.read_text().splitlines() if self.log.exists() else []:
            event, target, at = line.split()
            if event == "start":
                starts[target] = float(at)
            else:
                spans.append((starts.pop(target), float(at), target))
        return sorted(spans)


def held(job_id, number, **fields):
    return forge_spec(job_id, number=number, wait_for=({"profile": PROFILE},), **fields)


def slot_holders(redis_conn) -> list[str]:
    """Every wait-check slot held now, host and fleet."""
    keys = [key for key in redis_conn.scan_iter(f"{leases.PREFIX}:wc*") if not key.endswith(b":span")]
    return sorted(value.decode() for value in redis_conn.mget(keys) if value) if keys else []


def running_job(redis_conn, job_id):
    """A job RQ says is running (what keeps a slot it holds from being taken over)."""
    Queue("pi-jobs", connection=redis_conn).enqueue_call("tests.jobfuncs.defer_once", args=(1,),
                                                        job_id=job_id).set_status("started")


# --- the bounds, in process ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_check_never_takes_the_hosts_last_paid_slot(settings, redis_conn):
    settings.PI_WAIT_CHECK_SLOTS = 3
    assert [wait_slots.host_limit(concurrency) for concurrency in (1, 2, 3, 4, 10)] == [1, 1, 2, 3, 3]
    for index in range(4):
        registry.publish(redis_conn, registry.HostFacts(name="hostQ", declared=True, version="1", image="-"),
                         registry.ProcessFacts(worker_name=f"w-{index}", pid=index, proc="-", started_at=0))
    settings.PI_CONCURRENCY = None
    assert host_slots.concurrency(redis_conn, "hostQ") == 4  # one job per process
    settings.PI_CONCURRENCY = 2
    assert host_slots.concurrency(redis_conn, "hostQ") == 2


def test_the_lease_outlives_every_profile_it_guards(settings):
    settings.PI_WAIT_CHECK_TIMEOUT_SECONDS = 10
    longest_gate = 3 * (10 + hostscripts.KILL_GRACE_SECONDS)  # three profiles, each timed out and killed
    assert wait_slots.lease_seconds(3) > longest_gate
    assert wait_slots.lease_seconds(3) > wait_slots.lease_seconds(1)


@pytest.mark.django_db
def test_a_throttled_job_counts_its_denials_and_is_expired_unchecked_past_its_maximum_wait(
        settings, tmp_path, redis_conn, caplog):
    check = SlowCheck(tmp_path, seconds=0)
    settings.PI_WAIT_PROFILES = check.profiles
    settings.PI_WORKER_NAME = "hostT"
    settings.PI_WAIT_MAX_SECONDS = 3600
    settings.PI_WAIT_THROTTLE_SECONDS = 11
    settings.PI_WAIT_INTERVAL_SECONDS = 60  # a quarter of the backoff, 15 s, is over the floor
    running_job(redis_conn, "gh-checking")
    assert leases.acquire(redis_conn, "wc", 1, "hostU#gh-checking", 60)  # another host's check, fleet-wide
    enqueue_spec(spec := held("gh-throttled", 1))
    now = datetime.now(UTC)

    first = waitfor.gate(redis_conn, spec, now)
    second = waitfor.gate(redis_conn, spec, now + timedelta(seconds=16))

    assert first.reason == "wait-throttled" and 15 <= (first.defer_until - now).total_seconds() <= 16.5
    assert (second.detail["denials"], second.detail["where"], second.detail["checks"]) == (2, "fleet", 0)
    assert slot_holders(redis_conn) == ["hostU#gh-checking"]  # its own host slot was given back

    with caplog.at_level("INFO", logger="pidispatch"):
        expired = waitfor.gate(redis_conn, spec, now + timedelta(seconds=3601))

    assert expired.refuse == "wait-expired" and expired.detail == {"why": "max-wait-unchecked"}
    assert "wait_expired job=gh-throttled detail=max-wait-unchecked" in caplog.text
    assert not check.log.exists()  # never checked
    assert not redis_conn.exists(f"{waitfor.PREFIX}:job:gh-throttled")  # the hold is gone


@pytest.mark.django_db
def test_a_grant_ends_the_run_of_denials(settings, tmp_path, redis_conn):
    check = SlowCheck(tmp_path, seconds=0, answer=3)
    settings.PI_WAIT_PROFILES = check.profiles
    settings.PI_WORKER_NAME = ""  # undeclared: the host's own bound only
    running_job(redis_conn, "gh-local-check")
    host = this_host().name
    other = leases.acquire(redis_conn, f"wc:{host}", 1, f"{host}#gh-local-check", 60)
    enqueue_spec(spec := held("gh-waits-its-turn", 2))

    assert waitfor.gate(redis_conn, spec, datetime.now(UTC)).detail["where"] == "host"
    leases.release(redis_conn, other)
    granted = waitfor.gate(redis_conn, spec, datetime.now(UTC))

    assert granted.reason == "wait-for" and granted.detail["checks"] == 1  # checked: not yet
    assert redis_conn.hget(f"{waitfor.PREFIX}:job:gh-waits-its-turn", "denials") == b"0"
    assert slot_holders(redis_conn) == [] and not redis_conn.exists(f"{leases.PREFIX}:wc:span")  # never the fleet's


@pytest.mark.django_db
def test_a_superseded_job_and_an_unverified_holder_leave_the_check_slots_free(settings, tmp_path, redis_conn):
    check = SlowCheck(tmp_path, seconds=0, answer=3)
    settings.PI_WAIT_PROFILES = check.profiles
    settings.PI_WORKER_NAME = "hostS"
    enqueue_spec(first := held("gh-first", 3))
    assert waitfor.gate(redis_conn, first, datetime.now(UTC)).defer_until  # holds the wait for #3

    superseded = waitfor.gate(redis_conn, held("gh-second", 3), datetime.now(UTC))

    assert superseded.refuse == "wait-superseded"
    assert slot_holders(redis_conn) == []
    # The first one's state unreadable: neither superseded nor taken over, asked again later.
    redis_conn.hset("rq:job:gh-first", "created_at", "not-a-date")
    now = datetime.now(UTC)
    unverified = waitfor.gate(redis_conn, held("gh-third", 3), now)

    assert unverified.defer_until == now + timedelta(seconds=waitfor.SUPERSEDE_RECHECK_SECONDS)
    assert unverified.detail["holder"] == "unverified" and not unverified.refuse
    assert slot_holders(redis_conn) == []
    assert len(check.intervals()) == 1  # only the first one's check ever ran


# --- real workers ---------------------------------------------------------------------------------------------

# A throttled job looks again after half a second (a quarter of the 1 s backoff is below that floor).
FAST_WAITS = {"PI_WAIT_CHECK_SLOTS": "1", "PI_WAIT_THROTTLE_SECONDS": "0.5", "PI_WAIT_INTERVAL_SECONDS": "1",
              "PI_WAIT_CHECK_TIMEOUT_SECONDS": "20"}


def start_host(start_worker, redis_conn, name, check, processes=2):
    worker = start_worker("pi-jobs", f"pi-jobs@{name}", pool=processes, name=name,
                          env={"PI_WORKER_NAME": name, "PI_WAIT_PROFILES": check.profiles, **FAST_WAITS})
    wait_for(lambda: registry.process_count(redis_conn, name) == processes, timeout=90,
             what=f"{name}'s processes in the registry")
    return worker


@pytest.mark.django_db(transaction=True)
def test_two_hosts_never_run_two_checks_at_once(start_worker, redis_conn, fast_fleet, tmp_path):
    check = SlowCheck(tmp_path, seconds=1)
    hosts = {name: start_host(start_worker, redis_conn, name, check) for name in ("hostA", "hostB")}
    jobs = [enqueue_spec(held(f"gh-check-{name}-{i}", number), f"pi-jobs@{name}")
            for number, (name, i) in enumerate(((n, i) for i in range(3) for n in hosts), start=40)]

    wait_for(lambda: Run.objects.filter(job_id__in=jobs, outcome=Outcome.COMPLETED).count() == 6, timeout=180,
             interval=0.5, what="six completed runs")

    spans = check.intervals()
    assert len(spans) == 6
    for (_, first_end, first), (second_start, _, second) in zip(spans, spans[1:], strict=False):
        assert second_start >= first_end, f"the checks of {first} and {second} ran at the same time"
    logs = "".join(worker.output() for worker in hosts.values())
    assert "wait_check_throttled" in logs and "where=fleet" in logs  # a host was held back by the other's check


@pytest.mark.django_db(transaction=True)
def test_five_denials_log_one_alarm_and_the_held_lists_show_the_throttled_job(
        start_worker, redis_conn, fast_fleet, tmp_path, fleet_command, admin_client):
    check = SlowCheck(tmp_path, seconds=0, hold_targets=["acme/web#50"])
    worker = start_host(start_worker, redis_conn, "hostW", check)
    enqueue_spec(held("gh-long-check", 50), "pi-jobs@hostW")
    wait_for(lambda: check.log.exists(), timeout=60, what="the long check to start")
    enqueue_spec(held("gh-denied", 51), "pi-jobs@hostW")

    wait_for(lambda: "wait_capacity_exceeded job=gh-denied" in worker.output(), timeout=60, what="the alarm")
    alarm = re.search(r"wait_capacity_exceeded job=gh-denied .*", worker.output()).group(0)
    assert "denials=5" in alarm and "slots=1" in alarm and "concurrency=2" in alarm and "interval=1" in alarm
    assert "PI_WAIT_CHECK_SLOTS,PI_CONCURRENCY,PI_WAIT_INTERVAL_SECONDS" in alarm

    def throttled_in_status():
        rows = json.loads(fleet_command("status", "--json").stdout)["waiting"]
        return next((row for row in rows if row["job_id"] == "gh-denied" and row["kind"] == "throttled"), None)

    row = wait_for(throttled_in_status, timeout=30, what="fleet status to list it throttled")
    assert row["reason"] == "wait-throttled" and row["detail"]["denials"] >= 5
    panel = wait_for(lambda: 'data-job="gh-denied"' in (page := admin_client.get("/admin/fleet/fleetpanel/")
                                                         .content.decode()) and page, timeout=30, what="the panel")
    assert re.search(r"throttled.*wait-throttled · .*denials=\d+", panel.split('data-job="gh-denied"')[1], re.S)

    check.gate.touch()
    wait_for(lambda: Run.objects.filter(outcome=Outcome.COMPLETED).count() == 2, timeout=120, interval=0.5,
             what="both jobs to run once checked")
    assert worker.output().count("wait_capacity_exceeded") == 1
    assert slot_holders(redis_conn) == []
