"""A signed delivery becomes a real container run and a run record (real Redis, real Docker engine,
real `manage.py rqworker` processes)."""

import json
import threading
from decimal import Decimal
from pathlib import Path

import docker
import pytest
from rq import Queue

from apps.worker.models import Outcome, Run
from tests.conftest import CONTAINER_ENV, SHELL_OWN_ENV, joined, wait_for
from tests.receiver_support import deliver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]




def workspace_of(settings, job_id: str) -> Path:
    return Path(settings.PI_JOB_ROOT) / job_id / "workspace"


def test_labeled_issue_runs_a_container_and_records_a_completed_run(
    post_github, label_trigger, run_worker, settings
):
    job_id = deliver(post_github, "e2e-1", "Steps to reproduce. fake-agent:tokens-in=1200 fake-agent:tokens-out=345 "
                                           "fake-agent:cost=0.0123 fake-agent:turns=4")

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.exit_code, run.attempt) == (Outcome.COMPLETED, "", 0, 1)
    assert run.target == "acme/web#7" and run.scope == "github:acme/web"
    assert run.flow == "fix-bug" and run.trigger == label_trigger and run.trigger_type == "label"
    assert run.delivery_id == "e2e-1" and run.queue == "pi-jobs" and run.image == settings.PI_JOB_IMAGE
    assert (run.turns, run.tokens_in, run.tokens_out, run.tokens_total) == (4, 1200, 345, 1545)
    assert run.cost == Decimal("0.012300")
    assert run.usage == {"models": [{"provider": "fake", "model": "fake-1", "calls": 4, "input": 1200,
                                     "output": 345, "total": 1545, "cost": "0.012300"}]}
    assert run.ended_at >= run.started_at and run.host

    output = (workspace_of(settings, job_id) / "pi-output.md").read_text()
    assert f"job: {job_id}" in output and "flow: fix-bug" in output
    assert Run.objects.count() == 1


def test_prompt_and_event_files_carry_the_issue_as_fenced_data(post_github, label_trigger, run_worker, settings):
    job_id = deliver(post_github, "e2e-prompt", "Body with ~~~~ fences ~~~~~ inside")

    run_worker("pi-jobs")

    job_dir = Path(settings.PI_JOB_ROOT) / job_id / "job"
    prompt = (job_dir / "prompt.md").read_text()
    assert "Follow the `fix-bug` skill." in prompt
    assert "~~~~~~ data\n# Checkout button overlaps" in prompt  # the fence is longer than any run inside
    event = json.loads((job_dir / "event.json").read_text())
    assert event["jobId"] == job_id and event["target"]["number"] == 7
    assert event["trigger"]["matched"]["label"] == "pi"


def test_the_container_is_locked_down(post_github, label_trigger, run_worker, settings):
    job_id = deliver(post_github, "e2e-iso", "fake-agent:report fake-agent:sleep=3")
    engine = docker.from_env()
    seen = {}

    def inspect_while_running():
        container = wait_for(lambda: _find_container(engine, f"pi-job-{job_id}"), timeout=60, what="the job container")
        seen["attrs"] = container.attrs

    watcher = threading.Thread(target=inspect_while_running)
    watcher.start()
    run_worker("pi-jobs", env_overrides={"LEAK_CANARY": "from-the-worker"})
    joined(watcher, 100, "the container watcher")

    host_config, config = seen["attrs"]["HostConfig"], seen["attrs"]["Config"]
    assert host_config["CapDrop"] == ["ALL"]
    assert host_config["SecurityOpt"] == ["no-new-privileges"]
    assert host_config["PidsLimit"] == 512
    assert host_config["Memory"] == 256 * 1024**2 and host_config["MemorySwap"] == 256 * 1024**2
    assert host_config["NanoCpus"] == 2 * 10**9
    assert host_config["NetworkMode"] == "none"
    assert host_config["Privileged"] is False and host_config["Init"] is True
    assert host_config["ReadonlyRootfs"] is True and set(host_config["Tmpfs"]) == {"/tmp", "/home/pi"}
    assert config["User"] == "1000:1000"
    assert config["Labels"]["pidispatch.job"] == job_id
    mounts = {mount["Destination"]: mount for mount in seen["attrs"]["Mounts"]}
    assert mounts["/job"]["RW"] is False and mounts["/workspace"]["RW"] is True

    report = json.loads((workspace_of(settings, job_id) / "sandbox-report.json").read_text())
    assert report["uid"] == 1000 and report["gid"] == 1000
    assert report["cap_eff"] == "0000000000000000"
    assert report["no_new_privs"] == "1"
    assert report["interfaces"] == "lo"
    assert report["job_writable"] is False
    assert report["pids_max"] == "512"
    assert int(report["memory_max"]) == 256 * 1024**2
    # Nothing of the worker's environment (its webhook secret, a canary) reaches the container.
    env_names = set(report["env_names"].split()) - SHELL_OWN_ENV
    assert env_names <= CONTAINER_ENV, env_names - CONTAINER_ENV
    given = {entry.split("=", 1)[0] for entry in config["Env"]}
    assert given <= CONTAINER_ENV and "LEAK_CANARY" not in given and "GITHUB_WEBHOOK_SECRET" not in given
    assert "ANTHROPIC_API_KEY" not in given  # the provider key stays with the gateway
    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    assert _find_container(engine, f"pi-job-{job_id}") is None  # removed after the run


def _find_container(engine, name):
    found = engine.containers.list(all=True, filters={"name": name}, ignore_removed=True)
    return found[0] if found else None


def test_exit_2_is_a_policy_refusal_with_the_runners_known_reason(post_github, label_trigger, run_worker):
    job_id = deliver(post_github, "e2e-exit2", "fake-agent:exit=2 fake-agent:reason=cost-cap")

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.exit_code) == (Outcome.POLICY, "cost-cap", 2)
    assert run.tokens_total is not None  # telemetry still recorded


def test_exit_2_with_an_unknown_reason_is_runner_policy(post_github, label_trigger, run_worker):
    job_id = deliver(post_github, "e2e-exit2b", "fake-agent:exit=2 fake-agent:reason=i-made-this-up")

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).reason == "runner-policy"


def test_exit_1_is_retried_once_then_fails(post_github, label_trigger, run_worker, redis_conn):
    job_id = deliver(post_github, "e2e-exit1", "fake-agent:exit=1")

    run_worker("pi-jobs")
    first = Run.objects.get(job_id=job_id, attempt=1)
    assert (first.outcome, first.reason, first.exit_code) == (Outcome.FAILED, "runner-infra", 1)
    job = Queue("pi-jobs", connection=redis_conn).fetch_job(job_id)
    assert job.get_status() == "scheduled"  # the retry waits out its backoff (1 s in the tests)

    wait_for(lambda: run_worker("pi-jobs") and Run.objects.filter(job_id=job_id, attempt=2).exists(),
             timeout=30, interval=0.5, what="the second attempt")
    second = Run.objects.get(job_id=job_id, attempt=2)
    assert (second.outcome, second.reason) == (Outcome.FAILED, "runner-infra")
    assert Queue("pi-jobs", connection=redis_conn).fetch_job(job_id).get_status() == "failed"
    assert Run.objects.filter(job_id=job_id).count() == 2


def test_unknown_exit_code_is_an_infrastructure_fault(post_github, label_trigger, run_worker):
    job_id = deliver(post_github, "e2e-exit3", "fake-agent:exit=3")

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id, attempt=1)
    assert (run.outcome, run.reason, run.exit_code) == (Outcome.FAILED, "container-exit-unknown", 3)


def test_garbage_exit_line_records_no_usage_but_keeps_the_outcome(post_github, label_trigger, run_worker):
    job_id = deliver(post_github, "e2e-garbage", "fake-agent:garbage-exit")

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert run.outcome == Outcome.COMPLETED
    assert (run.turns, run.tokens_in, run.usage, run.cost) == (None, None, None, None)


def test_timeout_stops_the_container_as_worker_abort(post_github, label_trigger, run_worker):
    job_id = deliver(post_github, "e2e-timeout", "fake-agent:sleep=60")

    run_worker("pi-jobs", env_overrides={"PI_JOB_TIMEOUT_SECONDS": "2"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.POLICY, "worker-abort")
    assert (run.ended_at - run.started_at).total_seconds() < 20


def test_missing_image_is_refused_without_pulling(post_github, label_trigger, run_worker):
    job_id = deliver(post_github, "e2e-noimage")

    run_worker("pi-jobs", env_overrides={"PI_JOB_IMAGE": "pidispatch-absent:never"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.image) == (Outcome.POLICY, "job-image-missing", "pidispatch-absent:never")
    assert Run.objects.filter(job_id=job_id).count() == 1  # a policy refusal is never retried


def test_engine_down_is_retried(post_github, label_trigger, run_worker, redis_conn):
    job_id = deliver(post_github, "e2e-nodocker")

    run_worker("pi-jobs", env_overrides={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})

    run = Run.objects.get(job_id=job_id, attempt=1)
    assert (run.outcome, run.reason) == (Outcome.FAILED, "docker-unavailable")
    assert Queue("pi-jobs", connection=redis_conn).fetch_job(job_id).get_status() == "scheduled"


def test_no_issue_text_reaches_the_worker_log_or_the_record(post_github, label_trigger, run_worker):
    job_id = deliver(post_github, "e2e-pii", "SECRET-BODY-MARKER fake-agent:exit=0")

    result = run_worker("pi-jobs", env_overrides={"PI_LOG_LEVEL": "DEBUG"})

    output = result.stdout + result.stderr
    assert job_id in output
    for marker in ("SECRET-BODY-MARKER", "Checkout button", "maintainer-mia"):
        assert marker not in output
    record = json.dumps(list(Run.objects.filter(job_id=job_id).values()), default=str)
    assert "SECRET-BODY-MARKER" not in record and "Checkout button" not in record


def test_a_confirmed_oom_kill_is_a_policy_stop(post_github, label_trigger, run_worker):
    job_id = deliver(post_github, "e2e-oom", "fake-agent:oom")

    run_worker("pi-jobs", env_overrides={"PI_JOB_MEMORY": "64m"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.exit_code) == (Outcome.POLICY, "oom-killed", 137)
    assert Run.objects.filter(job_id=job_id).count() == 1  # never retried


def test_a_runners_token_claim_is_clamped_to_the_jobs_budget(post_github, label_trigger, run_worker, redis_conn):
    """The exit line is the container's word: a claim of 10^12 tokens (no provider call went through the
    gateway, so nothing was metered) counts no more than the job could have spent."""
    from django.utils import timezone

    from apps.worker.gates import budget

    job_id = deliver(post_github, "e2e-claim", "fake-agent:tokens-in=999999999999 fake-agent:tokens-out=1")

    run_worker("pi-jobs", env_overrides={"PI_MAX_TOKENS": "5000", "PI_DAILY_TOKEN_CAP": "100000"})

    run = Run.objects.get(job_id=job_id)
    assert run.outcome == Outcome.COMPLETED and run.tokens_total == 5000
    assert budget.tokens_spent_today(redis_conn, timezone.now()) == 5000  # the day's other jobs still run
