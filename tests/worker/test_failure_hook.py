"""The failure hook (PI_ON_FAILURE): a real executable in the test's folder records its argv, stdin and environment;
real workers run real containers to each end, and the hook runs for exactly the ends it pages on, once per job."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.utils import timezone

from apps.fleet import cancel
from apps.worker import failure_hook
from apps.worker.models import LostRetry, Outcome, Run
from tests.conftest import ROOT, wait_for
from tests.jobspecs import MARKER, enqueue_spec, marked_spec

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC_URL = "https://pi.example.invalid"


@pytest.fixture
def hook(tmp_path):
    """A hook that keeps, per call, its argv, stdin and environment's names in a folder `call-<pid>` of its own."""
    folder = tmp_path / "hook"
    folder.mkdir()
    script = folder / "on-failure"
    script.write_text(f"""#!/bin/sh
call={folder}/call-$$
mkdir "$call"
printf '%s\\n' "$@" > "$call/argv"
cat > "$call/stdin"
env | sed 's/=.*//' | sort > "$call/env"
exit 3
""")
    script.chmod(0o755)
    return script


def calls(hook: Path) -> list[dict]:
    folders = sorted(hook.parent.glob("call-*"), key=lambda folder: folder.stat().st_mtime)
    return [{"argv": (folder / "argv").read_text().splitlines(), "stdin": (folder / "stdin").read_text(),
             "env": (folder / "env").read_text().split()} for folder in folders]


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
    assert set(call["env"]) <= {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "PWD", "SHLVL", "_",
                                "OLDPWD"}
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


def test_a_worker_abort_pages_and_completed_or_refused_jobs_do_not(hook, run_worker):
    aborted = enqueue_spec(marked_spec("gh-hook-abort", body="fake-agent:sleep=30"))
    completed = enqueue_spec(marked_spec("gh-hook-done"))
    refused = enqueue_spec(marked_spec("gh-hook-refused", image="pidispatch-missing:never"))

    run_worker("pi-jobs", env_overrides=env(hook, PI_JOB_TIMEOUT_SECONDS="3"))

    outcomes = {run.job_id: (run.outcome, run.reason) for run in Run.objects.all()}
    assert outcomes == {aborted: (Outcome.POLICY, "worker-abort"), completed: (Outcome.COMPLETED, ""),
                        refused: (Outcome.POLICY, "job-image-missing")}
    assert [call["argv"][:3] for call in calls(hook)] == [[aborted, "policy", "worker-abort"]]


def test_an_operators_cancel_of_a_running_job_does_not_page(hook, start_worker, redis_conn, job_containers):
    worker = start_worker("pi-jobs", env=env(hook))
    job_id = enqueue_spec(marked_spec("gh-hook-cancel", body="fake-agent:sleep=60"))
    wait_for(lambda: job_containers().get(job_id), timeout=90, what="the container")

    assert cancel.cancel_job(redis_conn, job_id, by="test").outcome == "stopping"

    run = wait_for(lambda: Run.objects.filter(job_id=job_id).first(), timeout=60, what="the record")
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "operator-cancel", True)
    assert run.exit_code is not None  # it ran and spent: only the cancel keeps the hook quiet
    time.sleep(1)
    worker.stop()
    assert calls(hook) == []


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


def recorded(job_id: str, outcome: str, reason: str = "", exit_code=None, budget_reserved=True, **fields) -> Run:
    now = timezone.now()
    return Run.objects.create(job_id=job_id, kind="github", target="acme/web#7", outcome=outcome, reason=reason,
                              exit_code=exit_code, budget_reserved=budget_reserved, started_at=now, ended_at=now,
                              **fields)


@pytest.mark.parametrize("run_fields, pages", [
    (dict(outcome=Outcome.POLICY, reason="oom-killed", exit_code=137), True),
    (dict(outcome=Outcome.POLICY, reason="cost-cap", exit_code=2), True),  # the gateway stopped it
    (dict(outcome=Outcome.POLICY, reason="workspace-too-large", exit_code=0), False),  # it completed
    (dict(outcome=Outcome.POLICY, reason="ci-change-refused", exit_code=0), False),  # a publish refusal
    (dict(outcome=Outcome.POLICY, reason="job-image-missing", budget_reserved=False), False),
    (dict(outcome=Outcome.POLICY, reason="soft-hold"), False),  # held before the container: no exit code
    (dict(outcome=Outcome.POLICY, reason="operator-cancel", exit_code=143), False),
    (dict(outcome=Outcome.FAILED, reason="worker-lost", lost_retry=LostRetry.RETRIED), False),  # runs again
    (dict(outcome=Outcome.FAILED, reason="worker-lost", lost_retry=LostRetry.USED_UP), True),
    (dict(outcome=Outcome.FAILED, reason="worker-lost", lost_retry=LostRetry.CANCELLED), False),
    (dict(outcome=Outcome.FAILED, reason="publish-unavailable", exit_code=0), True),  # failed for good
    (dict(outcome=Outcome.COMPLETED, exit_code=0), False),
])
def test_which_records_page_and_each_job_pages_once(hook, settings, run_fields, pages):
    settings.PI_ON_FAILURE = str(hook)
    run = recorded("gh-hook-table", **run_fields)

    assert failure_hook.pages_for(run) is pages
    failure_hook.fire(run)
    failure_hook.fire(run)  # a second record of the same job (another attempt's, a lost one's) pages no more
    assert len(calls(hook)) == (1 if pages else 0)
