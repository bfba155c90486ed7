"""The real pi in the production image (make test builds it: PI_REAL_JOB_IMAGE), run by a real worker, reaching
its model only through its egress gateway. The model is a local scripted provider speaking Anthropic's API (the
default provider) behind PI_PROVIDER_BASE_URL, as a company proxy would be; the agent's tool calls are real."""

import json
import os
import subprocess
import sys
import tempfile
import threading
from datetime import UTC
from decimal import Decimal
from pathlib import Path

import docker
import pytest

from apps.worker.models import Outcome, Run
from devtools.scripted_provider import ScriptedProvider, Status, Text, ToolCall
from tests.conftest import FORGE_TOKEN_NAMES, ROOT, github_payload, joined, wait_for
from tests.egress_support import Listener
from tests.local_repos import local_root

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

MODEL_KEY = "sk-ant-real-provider-key-0123456789"
MODEL = "claude-sonnet-4-5"  # $3 in / $15 out per million tokens in pi's list
README_BEFORE = "A repository for the tests."  # what the GitHub stand-in's repositories hold


@pytest.fixture
def model():
    server = ScriptedProvider(key=MODEL_KEY)
    yield server
    server.close()


@pytest.fixture
def real_pi(model):
    image = os.environ["PI_REAL_JOB_IMAGE"]  # make test always builds it; a missing one is a setup failure
    return {"PI_JOB_IMAGE": image, "PI_PROVIDER": "anthropic", "PI_PROVIDER_BASE_URL": model.url,
            "ANTHROPIC_API_KEY": MODEL_KEY, "PI_MODEL": MODEL, "PI_JOB_MEMORY": "1g"}


def deliver(post_github, delivery: str, body: str) -> str:
    response = post_github(github_payload(body_text=body), delivery=delivery)
    assert response.status_code == 202, response.content
    return response.json()["jobs"][0]


def expected_cost(model: ScriptedProvider) -> Decimal:
    prompt, completion = model.reported()
    return ((Decimal(3) * prompt + Decimal(15) * completion) / 1_000_000).quantize(Decimal("0.000001"))


def test_a_labelled_issue_is_worked_on_by_the_real_pi_and_becomes_a_pull_request(
        post_github, label_trigger, run_worker, real_pi, model, settings, github_stand_in):
    model.scenarios["edit-readme"] = [
        ToolCall("edit", {"path": "README.md", "edits": [{"oldText": README_BEFORE, "newText": "Fixed by pi."}]}),
        ToolCall("bash", {"command": "env | sort; cat /job/pi-agent/models.json; "
                                     "git add -A && git commit -qm 'Fix the README' && git log --oneline -1"}),
        Text("Fix the README\n\nThe README now says what the repository is."),
    ]
    job_id = deliver(post_github, "real-1", "The README is wrong. scripted:edit-readme")
    seen = {}

    def inspect_while_running():
        engine = docker.from_env()
        container = wait_for(lambda: next(iter(engine.containers.list(
            all=True, filters={"name": f"pi-job-{job_id}"}, ignore_removed=True)), None), timeout=90,
            what="the job container")
        seen["attrs"] = container.attrs

    watcher = threading.Thread(target=inspect_while_running)
    watcher.start()
    run_worker("pi-jobs", env_overrides=real_pi, timeout=240)
    joined(watcher, 100, "the container watcher")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.exit_code) == (Outcome.COMPLETED, "", 0), run.reason
    workspace = Path(settings.PI_JOB_ROOT) / job_id / "workspace"
    assert (workspace / "README.md").read_text().startswith("Fixed by pi.")  # the edit tool ran in the clone

    # The record's numbers are the provider's own, counted by the gateway, and priced at pi's list price.
    prompt, completion = model.reported()
    assert [step.step for step in model.seen] == [0, 1, 2]
    assert (run.tokens_in, run.tokens_out, run.tokens_total) == (prompt, completion, prompt + completion)
    assert run.cost == expected_cost(model) and run.turns == 3
    assert run.usage["source"] == "gateway" and run.usage["models"][0]["model"] == MODEL

    # The provider saw the key; the container never had it: not in its environment, its /job files, or what
    # `env` printed inside it (which the provider received as the tool's result).
    assert all(step.key_accepted for step in model.seen)
    environment = seen["attrs"]["Config"]["Env"]
    assert not any(MODEL_KEY in entry for entry in environment)
    assert not any(entry.startswith("ANTHROPIC_API_KEY=") for entry in environment)
    assert "HTTPS_PROXY=http://127.0.0.1:3128" in environment
    job_files = [path for path in (Path(settings.PI_JOB_ROOT) / job_id / "job").rglob("*") if path.is_file()]
    assert job_files and not any(MODEL_KEY in path.read_text(errors="replace") for path in job_files)
    tool_output = model.seen[2].body
    assert "PI_JOB_ID=" in tool_output and "127.0.0.1:8080" in tool_output  # the env and models.json it saw
    assert MODEL_KEY not in tool_output
    assert seen["attrs"]["HostConfig"]["NetworkMode"] == "none"
    assert not any(entry.split("=", 1)[0] in FORGE_TOKEN_NAMES for entry in environment)  # nor a forge token

    # The worker, not the agent, took the agent's commit to the forge: a branch of the deployment's fork (the
    # default) and one draft pull request from it.
    assert (run.publish_outcome, run.pushed_commits) == ("published", 1) and run.changed_files >= 1
    (pull,) = [pr for pr in github_stand_in.created_pull_requests if pr["number"] == run.pull_request]
    assert pull["head"].startswith("pi/7-fix-bug") and pull["base"] == "main" and pull["draft"] is True
    assert pull["fork"] == "pi-demo-bot/web"
    # The pull request is titled by its issue (the forge's own text, for the forge only); the summary is its body.
    assert pull["title"].endswith("(#7)") and "The README now says what the repository is." in pull["body"]
    assert pull["issues"] == [7] and job_id in pull["body"] and run.publish_url
    pushed = subprocess.run(["git", "-C", str(github_stand_in.git_root / "pi-demo-bot/web.git"), "log", "-1",
                             "--format=%an|%s", pull["sha"]], capture_output=True, text=True, check=True).stdout
    assert pushed.strip() == "pidispatch|Fix the README"  # the agent's commit, written again as the bot's


def test_a_dispatch_run_local_job_runs_the_real_pi(worker_env, run_worker, real_pi, model):
    model.scenarios["notes"] = [ToolCall("write", {"path": "NOTES.md", "content": "written by pi\n"}),
                                Text("I wrote NOTES.md.")]
    base = Path(tempfile.mkdtemp(prefix="pidispatch-real-local-", dir=local_root()))
    base.chmod(0o755)
    folder = base / "app"
    folder.mkdir()
    for command in (["init", "-q", "-b", "main"], ["add", "."],
                    ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "init"]):
        if command[0] == "add":
            (folder / "README.md").write_text("hello\n")
        subprocess.run(["git", "-C", str(folder), *command], check=True, capture_output=True)
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, 1234, 1234)
    env = {**worker_env, **real_pi, "PI_WORKER_NAME": "hostA"}

    queued = subprocess.run([sys.executable, "manage.py", "dispatch_run", str(folder), "--task",
                             "Write the notes. scripted:notes"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.split()[1]
    run_worker("pi-jobs", "pi-jobs@hostA", env_overrides={**real_pi, "PI_WORKER_NAME": "hostA"}, timeout=240)

    run = Run.objects.get(job_id=job_id)
    assert run.outcome == Outcome.COMPLETED, run.reason
    notes = folder / "NOTES.md"
    assert notes.read_text() == "written by pi\n" and notes.stat().st_uid == 1234  # as the folder's owner
    assert (run.tokens_in, run.tokens_out) == model.reported()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def probe_scenario(port: int):
    """Both proxy forms, aimed at the host's loopback. 127.0.0.1 is NO_PROXY in the job (it is the container's
    own loopback, where its forwarders listen); the probe empties it so git asks the gateway, as an agent
    trying to get out would."""
    git = "NO_PROXY= no_proxy= git ls-remote"
    command = (f"{git} http://127.0.0.1:{port}/repo.git 2>&1; "  # absolute-form, through http_proxy
               f"{git} https://127.0.0.1:{port}/repo.git 2>&1; "  # CONNECT, through https_proxy
               f"git ls-remote http://127.0.0.1:{port}/repo.git 2>&1; echo probed")  # direct: the container's own
    return [ToolCall("bash", {"command": command}), Text("Probed.")]


def test_the_agents_requests_to_the_hosts_own_loopback_are_refused(
        post_github, label_trigger, run_worker, real_pi, model, listener):
    model.scenarios["probe"] = probe_scenario(listener.port)
    job_id = deliver(post_github, "real-probe", "scripted:probe")

    run_worker("pi-jobs", env_overrides=real_pi, timeout=240)

    assert listener.received == []  # nothing reached the host's listener, by either form
    tool_output = model.seen[1].body
    assert tool_output.count("403") >= 2 and "probed" in tool_output
    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED  # the agent went on without it


def test_an_allowed_host_and_port_is_reached(post_github, label_trigger, run_worker, real_pi, model, listener):
    model.scenarios["probe"] = probe_scenario(listener.port)
    deliver(post_github, "real-allowed", "scripted:probe")

    run_worker("pi-jobs", env_overrides={**real_pi, "PI_EGRESS_ALLOW": f"127.0.0.1:{listener.port}"}, timeout=240)

    assert any(request.startswith(b"GET /repo.git/info/refs") for request in listener.received)


def test_a_refused_provider_key_ends_the_run_once_as_policy(post_github, label_trigger, run_worker, real_pi, model):
    job_id = deliver(post_github, "real-401", "Fix it.")

    run_worker("pi-jobs", env_overrides={**real_pi, "ANTHROPIC_API_KEY": "sk-ant-revoked"}, timeout=240)

    (run,) = Run.objects.filter(job_id=job_id)  # no second attempt
    assert (run.outcome, run.reason) == (Outcome.POLICY, "provider-auth-refused")
    assert model.seen and not any(step.key_accepted for step in model.seen)


def test_a_failure_after_a_refused_request_is_egress_denied_not_a_retry(
        post_github, label_trigger, run_worker, real_pi, model):
    # The agent tries a provider the job was not given, then its own model fails the run.
    model.scenarios["elsewhere"] = [ToolCall("bash", {"command": "git ls-remote https://api.openai.com/v1 2>&1"}),
                                    Status(400)]
    job_id = deliver(post_github, "real-denied", "scripted:elsewhere")

    run_worker("pi-jobs", env_overrides=real_pi, timeout=240)

    (run,) = Run.objects.filter(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.POLICY, "egress-denied")


def test_the_gateway_cuts_a_run_at_its_token_budget(post_github, label_trigger, run_worker, real_pi, model):
    model.scenarios["long"] = [ToolCall("bash", {"command": f"echo step {i}"}) for i in range(8)] + [Text("done")]
    model.usage = lambda step: (45_000, 80)  # a long prompt each time
    job_id = deliver(post_github, "real-budget", "scripted:long")

    run_worker("pi-jobs", env_overrides={**real_pi, "PI_MAX_TOKENS": "100000"}, timeout=240)

    (run,) = Run.objects.filter(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.POLICY, "token-budget")
    # 45,080 tokens a call. Before each call the gateway reserves its worst case: pi's request (a few KB of system
    # prompt and tools: a token per byte at most) and the least useful answer. The third call's no longer fit in
    # what the first two left of 100,000, so it never left the host, and no call could have passed the budget.
    assert len(model.seen) == 2 and run.tokens_total == sum(model.reported()) == 90_160
    first = json.loads(model.seen[0].body)
    assert first["max_tokens"] <= 100_000 - len(model.seen[0].body)  # pi asked for 32,000: lowered to what was left


def test_the_gateway_ends_a_run_at_its_dollar_cap_and_the_window_is_charged_what_it_metered(
        post_github, label_trigger, run_worker, real_pi, model, redis_conn):
    from datetime import datetime

    from apps.worker.gates import budget

    model.scenarios["long"] = [ToolCall("bash", {"command": f"echo step {i}"}) for i in range(8)] + [Text("done")]
    model.usage = lambda step: (45_000, 80)
    label_trigger.max_cost_usd = Decimal("0.30")  # the rule's run.maxCostUsd lowers the deployment's $5
    label_trigger.save()
    job_id = deliver(post_github, "real-dollars", "scripted:long")

    # 45,000 in and 80 out at $3/$15 per million: $0.1362 a call. The third call's worst case (pi's request at the
    # cache-write rate, $3.75 per million tokens, and the least useful answer) does not fit in the $0.0276 left.
    run_worker("pi-jobs", env_overrides={**real_pi, "PI_MAX_COST_USD": "5", "PI_DAILY_COST_USD": "10"},
               timeout=240)

    (run,) = Run.objects.filter(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.POLICY, "cost-cap")
    assert len(model.seen) == 2  # the third call, past the cap, never left the host
    assert run.cost == expected_cost(model)
    assert (run.dollar_basis, run.dollars_reserved, run.dollars_charged) == ("metered", Decimal("0.30"), run.cost)
    assert run.cost == Decimal("0.272400") <= Decimal("0.30")
    used, held = redis_conn.hmget(budget.usd_window_keys("all", datetime.now(UTC))["day"], "used", "held")
    assert (int(used), int(held)) == (int(run.cost * 1_000_000), 0)


def test_the_real_pi_is_given_the_triggers_allowed_models_and_chooses_among_them(
        post_github, label_trigger, run_worker, real_pi, model):
    """No main model: pi takes the first model of the list it is given (`--models`); without the list it would ask
    for its own default, so the model the provider saw is the list's."""
    label_trigger.allowed_models = ["anthropic/claude-haiku-4-5", "anthropic/claude-sonnet-4-5"]
    label_trigger.save()
    model.scenarios["answer"] = [Text("Nothing needs to change.")]
    job_id = deliver(post_github, "real-models", "Look at the footer. scripted:answer")

    run_worker("pi-jobs", env_overrides={**real_pi, "PI_MODEL": ""}, timeout=240)

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason) == (Outcome.COMPLETED, ""), run.reason
    assert [json.loads(step.body)["model"] for step in model.seen] == ["claude-haiku-4-5"]
    (row,) = run.usage["models"]
    assert (row["provider"], row["model"], row["calls"]) == ("anthropic", "claude-haiku-4-5", 1)
