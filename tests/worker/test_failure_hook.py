"""The failure hook (PI_ON_FAILURE): a real executable in the test's folder records its argv, stdin and environment;
real workers run real containers to each end, and the hook runs for exactly the ends it pages on, once per job."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.fleet.cancel import request_key
from apps.worker.models import Outcome, Run
from tests.conftest import ROOT, wait_for
from tests.jobspecs import MARKER, enqueue_spec, marked_spec

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC_URL = "https://pi.example.invalid"


@pytest.fixture
def hook(tmp_path):
    """A hook that appends one JSON line per call to `calls.jsonl`: its argv, stdin and environment's names."""
    folder = tmp_path / "hook"
    folder.mkdir()
    script = folder / "on-failure"
    script.write_text(f"""#!/usr/bin/env python3
import json, os, sys
with open({str(folder / 'calls.jsonl')!r}, "a") as calls:
    calls.write(json.dumps({{"argv": sys.argv[1:], "stdin": sys.stdin.read(), "env": sorted(os.environ)}}) + "\\n")
sys.exit(3)
""")
    script.chmod(0o755)
    return script


def calls(hook: Path) -> list[dict]:
    path = hook.parent / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def env(hook: Path, **more) -> dict:
    return {"PI_ON_FAILURE": str(hook), "PI_PUBLIC_URL": PUBLIC_URL, **more}


def test_an_in_container_policy_stop_runs_the_hook_once_with_ids_only(hook, run_worker):
    job_id = enqueue_spec(marked_spec("gh-hook-policy", body="fake-agent:exit=2"))

    result = run_worker("pi-jobs", env_overrides=env(hook, PI_WORKER_NAME="hostA"))

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.POLICY, "runner-policy")
    [call] = calls(hook)
    assert call["argv"] == [job_id, "policy", "runner-policy", "hostA"]
    document = json.loads(call["stdin"])
    assert {key: document[key] for key in ("jobId", "attempt", "outcome", "reason", "host", "target", "exitCode",
                                           "runUrl")} == {
        "jobId": job_id, "attempt": 1, "outcome": "policy", "reason": "runner-policy", "host": "hostA",
        "target": "acme/web#7", "exitCode": 2, "runUrl": f"{PUBLIC_URL}/admin/worker/run/{run.pk}/change/"}
    assert MARKER not in call["stdin"]  # no title, body, comment or instructions
    # A closed environment: none of the worker's keys, tokens or database.
    assert not set(call["env"]) & {"ANTHROPIC_API_KEY", "GITHUB_TOKEN", "DATABASE_URL", "PI_ON_FAILURE"}
    assert set(call["env"]) <= {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "PWD", "SHLVL", "_"}
    assert f"failure_hook_ran job={job_id} outcome=policy reason=runner-policy result=exit-3" in result.stderr
    assert MARKER not in result.stderr


def test_an_infrastructure_fault_runs_the_hook_after_the_last_attempt_only(hook, run_worker):
    job_id = enqueue_spec(marked_spec("gh-hook-infra", body="fake-agent:exit=1"))

    run_worker("pi-jobs", env_overrides=env(hook))
    assert Run.objects.filter(job_id=job_id).count() == 1 and calls(hook) == []  # retried: no page yet
    wait_for(lambda: run_worker("pi-jobs", env_overrides=env(hook)) and Run.objects.filter(job_id=job_id).count() == 2,
             timeout=30, interval=0.5, what="the second attempt")

    [call] = calls(hook)
    assert call["argv"][:3] == [job_id, "failed", "runner-infra"]
    assert json.loads(call["stdin"])["attempt"] == 2


def test_a_worker_abort_pages_and_completed_refused_or_cancelled_jobs_do_not(hook, run_worker, redis_conn):
    aborted = enqueue_spec(marked_spec("gh-hook-abort", body="fake-agent:sleep=30"))
    completed = enqueue_spec(marked_spec("gh-hook-done"))
    refused = enqueue_spec(marked_spec("gh-hook-refused", image="pidispatch-missing:never"))
    cancelled = enqueue_spec(marked_spec("gh-hook-cancelled"))
    redis_conn.set(request_key(cancelled), "test")

    run_worker("pi-jobs", env_overrides=env(hook, PI_JOB_TIMEOUT_SECONDS="3"))

    outcomes = {run.job_id: (run.outcome, run.reason) for run in Run.objects.all()}
    assert outcomes == {aborted: (Outcome.POLICY, "worker-abort"), completed: (Outcome.COMPLETED, ""),
                        refused: (Outcome.POLICY, "job-image-missing"), cancelled: (Outcome.POLICY, "operator-cancel")}
    assert [call["argv"][:3] for call in calls(hook)] == [[aborted, "policy", "worker-abort"]]


def test_a_hook_past_its_time_is_stopped_and_the_worker_goes_on(tmp_path, run_worker):
    script = tmp_path / "slow-hook"
    script.write_text(f"#!/bin/sh\necho started > {tmp_path}/started\nsleep 60\necho finished > {tmp_path}/finished\n")
    script.chmod(0o755)
    job_id = enqueue_spec(marked_spec("gh-hook-slow", body="fake-agent:exit=2"))

    started = time.monotonic()
    result = run_worker("pi-jobs", env_overrides={"PI_ON_FAILURE": str(script), "PI_ON_FAILURE_TIMEOUT_MS": "1000"})

    assert time.monotonic() - started < 45
    assert (tmp_path / "started").exists() and not (tmp_path / "finished").exists()
    assert f"failure_hook_ran job={job_id} outcome=policy reason=runner-policy result=timeout" in result.stderr


def test_a_relative_hook_path_stops_the_worker_from_starting(worker_env):
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                            env={**worker_env, "PI_ON_FAILURE": "bin/page-me"})
    assert result.returncode != 0 and "PI_ON_FAILURE='bin/page-me' is not an absolute path" in result.stderr
