"""`manage.py doctor`, run as an operator runs it, against the test stack's own Redis and Docker engine: what it
says works, what it says to do about what does not, its exit code (0 only when a job could run here), and
that it never prints a secret."""

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time

import docker
import pytest

from apps.fleet import registry
from apps.worker.sandbox import image_contract
from devtools.scripted_provider import ScriptedProvider
from tests.conftest import PROVIDER_KEY, ROOT, WEBHOOK_SECRET
from tests.receiver_support import STAND_IN_TOKEN

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def doctor(worker_env):
    """Run `manage.py doctor` with the worker's environment, changed as a test says (None: unset)."""

    def run(*args, **changes):
        env = {**worker_env}
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = str(value)
        result = subprocess.run([sys.executable, "manage.py", "doctor", *args], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        for secret in (PROVIDER_KEY, WEBHOOK_SECRET, STAND_IN_TOKEN, env.get("ANTHROPIC_API_KEY") or PROVIDER_KEY):
            assert secret not in result.stdout + result.stderr
        return result

    return run


def line(output: str, status: str, check: str) -> str:
    """The finding of `check` with `status`, and its what-to-do line when it has one."""
    lines = output.splitlines()
    for index, text in enumerate(lines):
        if text.split()[:2] == [status, check]:
            follow = lines[index + 1] if index + 1 < len(lines) else ""
            return text + ("\n" + follow if follow.strip().startswith("->") else "")
    raise AssertionError(f"no `{status} {check}` line in:\n{output}")


def test_a_working_host_can_run_a_job_and_says_what_to_improve(doctor, redis_conn):
    result = doctor()
    assert result.returncode == 0, result.stdout
    out = result.stdout
    assert "ok    database" in out and "migrations applied" in out
    assert "Redis" in line(out, "ok", "redis")
    # The tests' Redis keeps no append-only file: said, with the command that fixes it.
    assert "appendonly no" in line(out, "warn", "redis-aof")
    assert "-> redis-cli CONFIG SET appendonly yes; CONFIG SET appendfsync always" in line(out, "warn", "redis-aof")
    assert os.environ["DOCKER_HOST"] in line(out, "ok", "docker")
    assert f"runner protocol {image_contract.RUNNER_PROTOCOL}" in line(out, "ok", "job-image")
    assert "ANTHROPIC_API_KEY set (20 chars)" in line(out, "ok", "provider")
    assert "GITHUB_TOKEN set" in line(out, "ok", "forge-github")
    assert "GiB free under" in line(out, "ok", "disk")
    assert "fixed against lazy fetching" in line(out, "ok", "git")
    assert "python manage.py rqworker pi-jobs" in line(out, "warn", "workers")  # no worker runs now
    assert "nothing else" in line(out, "ok", "settings")
    assert re.search(r"a job can run on this host \(\d+ warnings\)$", out.rstrip())

    # An append-only file synced on every write is what a queued job needs: then it is ok.
    redis_conn.config_set("appendfsync", "always")
    redis_conn.config_set("appendonly", "yes")
    try:
        report = json.loads(doctor("--json").stdout)
    finally:
        redis_conn.config_set("appendonly", "no")
        redis_conn.config_set("appendfsync", "everysec")
    assert report["job_could_run"] is True
    here = report["hosts"][0]
    assert here["this_host"] is True
    assert {c["check"]: c["status"] for c in here["checks"]}["redis-aof"] == "ok"


def test_redis_unreachable(doctor):
    from devtools.services import free_port

    port = free_port()
    result = doctor(REDIS_URL=f"redis://:hunter2-redis-password@127.0.0.1:{port}/0")
    assert result.returncode == 1
    assert f"no answer at redis://127.0.0.1:{port}/0" in line(result.stdout, "FAIL", "redis")
    assert "-> start Redis, or set REDIS_URL" in line(result.stdout, "FAIL", "redis")
    assert "hunter2-redis-password" not in result.stdout
    assert "no job can run on this host: 1 FAIL (redis)" in result.stdout


def test_job_image_missing_or_unlabelled(doctor):
    result = doctor(PI_JOB_IMAGE="pidispatch-doctor-missing:none")
    assert result.returncode == 1
    assert "-> build it here with `make image`" in line(result.stdout, "FAIL", "job-image")

    # An image built without the runner's labels: the worker would refuse it, so the doctor says so first.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("hello")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    engine = docker.from_env()
    engine.api.import_image_from_data(buffer.getvalue(), repository="pidispatch-doctor-unlabelled", tag="latest")
    try:
        result = doctor(PI_JOB_IMAGE="pidispatch-doctor-unlabelled:latest")
    finally:
        engine.images.remove("pidispatch-doctor-unlabelled:latest", force=True)
    assert result.returncode == 1
    found = line(result.stdout, "FAIL", "job-image")
    assert "job-image-unlabelled" in found and "-> rebuild it with this checkout's `make image`" in found


def test_no_provider_key(doctor):
    result = doctor(ANTHROPIC_API_KEY=None)
    assert result.returncode == 1
    found = line(result.stdout, "FAIL", "provider")
    assert "ANTHROPIC_API_KEY not set" in found and "provider-unconfigured" in found
    assert "-> set ANTHROPIC_API_KEY in the worker's environment" in found


def test_disk_below_the_threshold_fails_and_below_a_jobs_size_warns(doctor):
    result = doctor(PI_DOCTOR_MIN_FREE_MB=10**9)
    assert result.returncode == 1
    assert "below PI_DOCTOR_MIN_FREE_MB" in line(result.stdout, "FAIL", "disk")
    assert "-> free space on that filesystem, or point PI_JOB_ROOT" in line(result.stdout, "FAIL", "disk")

    result = doctor(PI_JOB_DISK_MB=10**9)
    assert result.returncode == 0
    assert "-> free space, or lower PI_JOB_DISK_MB" in line(result.stdout, "warn", "disk")


def test_an_old_git_fails_naming_its_version_and_what_to_install(doctor, tmp_path):
    (tmp_path / "git").write_text("#!/bin/sh\necho 'git version 2.43.3'\n")  # before 2.43.4 fixed lazy fetching
    (tmp_path / "git").chmod(0o755)
    result = doctor(PATH=f"{tmp_path}:{os.environ['PATH']}")
    assert result.returncode == 1
    found = line(result.stdout, "FAIL", "git")
    assert "git 2.43.3 lets a repository the agent wrote" in found
    assert "-> install git 2.43.4 or later; the worker does not start until then" in found


def test_profiles_and_forge_config_are_validated(doctor, tmp_path):
    resolver = tmp_path / "resolver"
    resolver.write_text("#!/bin/sh\necho x\n")  # not executable
    result = doctor(PI_SECRET_PROFILES=f"vault:{resolver}", PI_WAIT_PROFILES="ci:relative/path",
                    PI_EGRESS_ALLOW="registry.npmjs.org:443")
    assert result.returncode == 1
    assert f"-> install it at {resolver} and chmod +x it" in line(result.stdout, "FAIL", "secret-profiles")
    assert "is not `name:/absolute/path`" in line(result.stdout, "FAIL", "wait-profiles")
    assert "registry.npmjs.org:443" in line(result.stdout, "ok", "egress-allowlist")

    result = doctor(GITHUB_SELF_ID=None, GITHUB_TOKEN=None, PI_EGRESS_ALLOW="not a host")
    assert result.returncode == 1
    assert "GITHUB_SELF_ID is required" in line(result.stdout, "FAIL", "forges")
    assert "-> fix PI_EGRESS_ALLOW" in line(result.stdout, "FAIL", "egress-allowlist")

    # What else `manage.py check` refuses, the worker would refuse to start with.
    result = doctor(PI_JOB_DISK_MB=-1)
    assert result.returncode == 1
    assert "PI_JOB_DISK_MB must be at least 0" in line(result.stdout, "FAIL", "settings")


def test_live_calls_the_provider_through_a_gateway_and_reads_the_token_scopes(doctor, fake_forge):
    provider = ScriptedProvider(key="sk-doctor-live-key")
    fake_forge.routes["/user"] = (200, {"login": "pi-bot", "id": 42}, {"X-OAuth-Scopes": "repo, workflow"})
    fake_forge.routes["/api/v4/user"] = (200, {"username": "pi-gl-bot", "id": 7})
    fake_forge.routes["/api/v4/personal_access_tokens/self"] = (200, {"scopes": ["api", "sudo"]})
    common = {"PI_PROVIDER_BASE_URL": provider.url, "PI_MODEL": "claude-sonnet-4-5",
              "GITHUB_API_URL": fake_forge.url, "GITLAB_URL": fake_forge.url, "GITLAB_WEBHOOK_MODE": "token",
              "GITLAB_WEBHOOK_SECRET": "gitlab-hook-secret", "GITLAB_TOKEN": "glpat-doctor-token",
              "GITLAB_SELF_ID": "7"}
    try:
        result = doctor("--live", ANTHROPIC_API_KEY="sk-doctor-live-key", **common)
        assert result.returncode == 0, result.stdout
        assert "answered through a gateway (" in line(result.stdout, "ok", "provider-call")
        # The key reached the provider from the gateway, not from the doctor's request.
        assert [seen.key_accepted for seen in provider.seen] == [True]
        scopes = line(result.stdout, "warn", "forge-github-live")
        assert "token of pi-bot has scopes repo, workflow" in scopes and "-> use a token with only `repo`" in scopes
        github_asked = [r for r in fake_forge.requests if r["path"] == "/user"]
        assert github_asked[-1]["headers"]["authorization"] == f"Bearer {STAND_IN_TOKEN}"
        assert "token of pi-gl-bot has scopes api, sudo" in line(result.stdout, "warn", "forge-gitlab-live")
        assert "-> drop sudo" in line(result.stdout, "warn", "forge-gitlab-live")
        assert "glpat-doctor-token" not in result.stdout and "gitlab-hook-secret" not in result.stdout

        fake_forge.routes["/user"] = (401, {"message": "Bad credentials"})
        result = doctor("--live", ANTHROPIC_API_KEY="sk-a-wrong-key", **common)
        assert result.returncode == 1
        refused = line(result.stdout, "FAIL", "provider-call")
        assert "the provider refused the key (HTTP 401)" in refused and "-> replace the key" in refused
        assert "-> create a new token and set GITHUB_TOKEN" in line(result.stdout, "FAIL", "forge-github-live")
        assert "sk-a-wrong-key" not in result.stdout
    finally:
        provider.close()


def test_other_live_hosts_as_they_last_reported(doctor, redis_conn):
    now = time.time()
    registry.publish(redis_conn, registry.HostFacts(name="hostB", declared=True, version="0.0.1-old",
                                                    image="pi-job:other", capabilities=("wait:ci",), concurrency=2),
                     registry.ProcessFacts(worker_name="rq:worker:hostB-1", pid=1, proc="elsewhere/1/1",
                                           started_at=now, queues=("pi-jobs", "pi-jobs@hostB")), now=now)
    # A worker of this machine declared by its queue (`rqworker pi-jobs@hostA`): this host's, not another's.
    registry.publish(redis_conn, registry.HostFacts(name="hostA", declared=True, version="x", image="y"),
                     registry.ProcessFacts(worker_name="rq:worker:hostA-1", pid=os.getpid(),
                                           proc=registry.process_identity(), started_at=now,
                                           queues=("pi-jobs", "pi-jobs@hostA")), now=now)
    result = doctor()
    assert result.returncode == 0
    assert "hostA: 1 worker process (pi-jobs, pi-jobs@hostA), 0 busy" in line(result.stdout, "ok", "workers")
    assert "== hostA" not in result.stdout
    section = result.stdout[result.stdout.index("== hostB (live, as it reported"):]
    assert "1 worker process, 0 busy, cap 2, capabilities wait:ci" in line(section, "ok", "registry")
    assert "runs pidispatch 0.0.1-old" in line(section, "warn", "version")
    assert "runs pi-job:other" in line(section, "warn", "job-image")
    report = json.loads(doctor("--json").stdout)
    assert [host["name"] for host in report["hosts"]][1:] == ["hostB"]


def test_housekeeping_not_run_for_two_days_warns(doctor, redis_conn):
    from datetime import datetime, timedelta

    from django.core.management import call_command
    from django.utils import timezone

    from apps.worker import housekeeping

    found = line(doctor().stdout, "warn", "housekeeping")
    assert "no run on record" in found and "-> python manage.py housekeeping" in found

    call_command("housekeeping", stdout=io.StringIO())
    result = doctor()
    assert result.returncode == 0
    assert "last ran " in line(result.stdout, "ok", "housekeeping") and "(command)" in result.stdout

    # Two days and a bit later, nothing has run since.
    record = json.loads(redis_conn.get(housekeeping.LAST_KEY))
    record["at"] = (datetime.fromisoformat(record["at"]) - timedelta(days=2, hours=1)).isoformat()
    redis_conn.set(housekeeping.LAST_KEY, json.dumps(record))
    result = doctor()
    assert result.returncode == 0  # a warning: jobs still run
    found = line(result.stdout, "warn", "housekeeping")
    assert "has not run for 2 days" in found and "-> python manage.py housekeeping" in found
    assert "look for housekeeping_failed in their logs" in found

    # And when today's daily run failed, it says so.
    redis_conn.set(housekeeping.day_key(timezone.now()),
                   json.dumps({"state": "failed", "at": timezone.now().isoformat(), "error": "OperationalError"}))
    assert "today's run failed (OperationalError)" in line(doctor().stdout, "warn", "housekeeping")


def test_live_against_the_demos_stand_ins_passes_and_spends_none_of_the_days_tokens(doctor, redis_conn):
    """`make run`'s stand-ins (devtools/fake_forge.github_for_any_repository, the scripted provider): a fresh demo
    passes `doctor --live`, and its probe call is not one of the day's tokens (PI_DAILY_TOKEN_CAP counts jobs)."""
    from django.utils import timezone

    from apps.worker.gates import budget

    provider = ScriptedProvider(key="sk-demo-key")
    try:
        result = doctor("--live", ANTHROPIC_API_KEY="sk-demo-key", PI_PROVIDER_BASE_URL=provider.url,
                        PI_MODEL="claude-sonnet-4-5", PI_DAILY_TOKEN_CAP="100000")
        assert result.returncode == 0, result.stdout
        assert "answered through a gateway (" in line(result.stdout, "ok", "provider-call")
        assert [seen.key_accepted for seen in provider.seen] == [True]
        assert budget.tokens_spent_today(redis_conn, timezone.now()) == 0
        assert "token of pi-demo-bot, scopes repo" in line(result.stdout, "ok", "forge-github-live")
        assert not [text for text in result.stdout.splitlines() if text.startswith("FAIL")]
    finally:
        provider.close()
