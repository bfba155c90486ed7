"""The sandbox: `manage.py sandbox <job id>` on the host that ran a job opens a fresh container from the run's image
on its kept workspace, with the job's isolation flags, no credentials and no network; the run page says where and
until when; the folder sweeps keep a kept run's folder until its time (or its pin) is up, and while a sandbox uses
it, whether or not the command that opened it is still alive."""

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import docker
import pytest
from django.utils import timezone

from apps.worker.models import Run
from apps.worker.sandbox import container, jobfiles, sandboxes
from tests.conftest import PROVIDER_KEY, ROOT, SHELL_OWN_ENV, wait_for
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

HOST = {"PI_WORKER_NAME": "hostA"}
# The same look the demo runner takes at its own container (`fake-agent:report`), from inside the sandbox.
PROBE = r"""
caps=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)
nnp=$(sed -n 's/^NoNewPrivs:[[:space:]]*//p' /proc/self/status)
nets=$(ls /sys/class/net | tr '\n' ' ' | sed 's/ $//')
if touch /job/.write-probe 2>/dev/null; then job_writable=true; else job_writable=false; fi
pids_max=$(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max 2>/dev/null || echo unknown)
mem_max=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max 2>/dev/null)
env_names=$(env | sed 's/=.*//' | sort | tr '\n' ' ' | sed 's/ $//')
echo "{\"uid\": $(id -u), \"gid\": $(id -g), \"cap_eff\": \"$caps\", \"no_new_privs\": \"$nnp\", \
\"interfaces\": \"$nets\", \"job_writable\": $job_writable, \"pids_max\": \"$pids_max\", \
\"memory_max\": \"$mem_max\", \"env_names\": \"$env_names\"}"
"""
SANDBOX_ENV = {"HOME", "PATH", "HOSTNAME", "PI_JOB_ID", "PI_SANDBOX", "TMOUT"}


@pytest.fixture(autouse=True)
def no_sandboxes():
    """No sandbox container of an earlier run of these tests (the engine's data outlives a run)."""
    for found in docker.from_env().containers.list(all=True, filters={"label": sandboxes.SANDBOX_LABEL}):
        found.remove(force=True)


def sandbox_command(worker_env, *args, env=None, timeout=60):
    return subprocess.run([sys.executable, "manage.py", "sandbox", *args], cwd=ROOT,
                          env={**worker_env, **HOST, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def finished_run(run_worker, settings, job_id: str, body: str = "fake-agent:report") -> Run:
    enqueue_spec(forge_spec(job_id, body=body))
    run_worker("pi-jobs", env_overrides=HOST)
    run = Run.objects.get(job_id=job_id)
    assert run.outcome == "completed" and run.host == "hostA"
    return run


def test_a_finished_runs_workspace_is_in_its_sandbox_with_the_jobs_isolation_and_nothing_else(
        run_worker, worker_env, settings, admin_client):
    run = finished_run(run_worker, settings, "gh-sbx-look")
    assert timedelta(hours=23, minutes=59) < run.sandbox_until - timezone.now() <= timedelta(hours=24)
    job_report = json.loads((settings.PI_JOB_ROOT / "gh-sbx-look" / "workspace" / "sandbox-report.json").read_text())

    looked = sandbox_command(worker_env, "gh-sbx-look", "--command",
                             "cat /workspace/pi-output.md && echo ---; " + PROBE)

    assert looked.returncode == 0, looked.stderr
    output, _, probe = looked.stdout.partition("---\n")
    assert output.strip()  # what the agent left in the workspace
    seen = json.loads(probe)
    for flag in ("uid", "gid", "cap_eff", "no_new_privs", "interfaces", "job_writable", "pids_max", "memory_max"):
        assert seen[flag] == job_report[flag], flag
    assert seen["interfaces"] == "lo" and seen["cap_eff"] == "0000000000000000" and seen["uid"] != 0
    assert set(seen["env_names"].split()) - SHELL_OWN_ENV <= SANDBOX_ENV  # no proxy, no key, no token
    assert PROVIDER_KEY not in looked.stdout and worker_env["GITHUB_TOKEN"] not in looked.stdout
    # No way out: no network, and no gateway socket to reach one through.
    cut_off = sandbox_command(worker_env, "gh-sbx-look", "--command",
                              "ls /run/pi-egress 2>&1; wget -q -T 3 -O - http://1.1.1.1/ 2>&1; echo exit=$?")
    assert "exit=0" not in cut_off.stdout and ".sock" not in cut_off.stdout
    # What a file the agent wrote prints is shown as text: its terminal control sequences never reach the terminal.
    printed = sandbox_command(worker_env, "gh-sbx-look", "--command",
                              r"printf 'a\033]52;c;SGVsbG8=\007b\033[2J\033[31mred\033[0m\rX\tY\n'")
    assert printed.stdout == "abredX\tY\n"
    # A command's exit code is the sandbox command's.
    assert sandbox_command(worker_env, "gh-sbx-look", "--command", "exit 3").returncode == 3
    assert not docker.from_env().containers.list(all=True, filters={"label": sandboxes.SANDBOX_LABEL})

    page = admin_client.get(f"/admin/worker/run/{run.pk}/change/").content.decode()
    assert "on host <strong>hostA</strong> until" in page
    assert "<code>python manage.py sandbox gh-sbx-look</code>" in page

    listed = sandbox_command(worker_env, "--list")
    assert "gh-sbx-look" in listed.stdout and "until" in listed.stdout
    pinned = sandbox_command(worker_env, "gh-sbx-look", "--pin", env={"PI_SANDBOX_PIN_DAYS": "7"})
    assert pinned.returncode == 0, pinned.stderr
    run.refresh_from_db()
    assert timedelta(days=7, hours=23) < run.sandbox_until - timezone.now() <= timedelta(days=8)
    assert f"{run.sandbox_until:%Y-%m-%d %H:%M}" in pinned.stdout


def test_the_sandbox_container_has_the_jobs_flags_and_only_the_jobs_two_folders(run_worker, settings):
    finished_run(run_worker, settings, "gh-sbx-flags", body="")
    seen = {}

    sandboxes.open_sandbox("gh-sbx-flags", command="true",
                           on_created=lambda created: seen.update(created.client.api.inspect_container(created.id)))

    host_config = seen["HostConfig"]
    job = container.isolation_options(container.job_user(), memory="256m", cpus=settings.PI_JOB_CPUS)
    assert host_config["NetworkMode"] == "none"
    assert host_config["CapDrop"] == ["ALL"] and host_config["SecurityOpt"] == ["no-new-privileges"]
    assert host_config["ReadonlyRootfs"] is True and host_config["Init"] is True and not host_config["Privileged"]
    assert host_config["PidsLimit"] == job["pids_limit"] and host_config["Memory"] == job["mem_limit"]
    assert host_config["NanoCpus"] == job["nano_cpus"] and seen["Config"]["User"] == job["user"]
    mounts = {mount["Destination"]: mount for mount in seen["Mounts"]}
    assert set(mounts) == {"/job", "/workspace"}
    assert mounts["/job"]["RW"] is False and mounts["/workspace"]["RW"] is True
    assert Path(mounts["/workspace"]["Source"]) == settings.PI_JOB_ROOT / "gh-sbx-flags" / "workspace"


def test_on_another_host_it_says_which_host_has_the_sandbox(worker_env, settings, tmp_path):
    now = timezone.now()
    Run.objects.create(job_id="gh-sbx-there", kind="github", target="acme/web#7", host="hostA", started_at=now,
                       ended_at=now, outcome="completed", sandbox_until=now + timedelta(hours=5))

    asked = sandbox_command(worker_env, "gh-sbx-there", env={"PI_WORKER_NAME": "hostB",
                                                             "PI_JOB_ROOT": str(tmp_path / "jobs")})

    assert asked.returncode != 0
    assert "gh-sbx-there ran on host hostA, not on this one (hostB)" in asked.stderr
    assert "On hostA: python manage.py sandbox gh-sbx-there" in asked.stderr
    unknown = sandbox_command(worker_env, "gh-sbx-nothing", "--command", "true")
    assert unknown.returncode != 0 and "no run has the job id gh-sbx-nothing" in unknown.stderr


def kept_in_a_process(root: Path, job_id: str, ended_hours_ago: float) -> None:
    """A forge job's folder as its work horse leaves it after the container ended `ended_hours_ago`."""
    pid = os.fork()
    if pid == 0:
        try:
            dirs = jobfiles.prepare(forge_spec(job_id), root, owner=container.job_user())
            sandboxes.retain(dirs, job_id=job_id, image=os.environ["PI_JOB_IMAGE"], user=container.job_user(),
                             memory="128m", cpus=0.5, host="hostA",
                             now=timezone.now() - timedelta(hours=ended_hours_ago))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_the_sweeps_keep_a_runs_folder_for_its_retention_its_pin_and_its_live_sandboxes(worker_env, settings):
    root = settings.PI_JOB_ROOT
    kept_in_a_process(root, "gh-sbx-old", ended_hours_ago=25)
    kept_in_a_process(root, "gh-sbx-fresh", ended_hours_ago=1)
    kept_in_a_process(root, "gh-sbx-pinned", ended_hours_ago=23)
    kept_in_a_process(root, "gh-sbx-open", ended_hours_ago=23)
    sandboxes.pin("gh-sbx-pinned")
    sweep = lambda: jobfiles.remove_unheld(root, timezone.now() + timedelta(hours=2),  # noqa: E731
                                          in_use=sandboxes.in_use)
    # A sandbox opened in time, whose command was then killed: its container lives on, and so does the folder.
    opened = subprocess.Popen([sys.executable, "manage.py", "sandbox", "gh-sbx-open", "--command", "sleep 120"],
                              cwd=ROOT, env={**worker_env, **HOST})
    engine = docker.from_env()
    try:
        wait_for(lambda: engine.containers.list(filters={"label": f"{sandboxes.SANDBOX_LABEL}=gh-sbx-open"}),
                 timeout=30, what="the sandbox to start")
        assert sorted(sweep()) == ["gh-sbx-old"]  # the command holds the folder, and its container uses it
        opened.send_signal(signal.SIGKILL)
        opened.wait(timeout=10)

        assert sweep() == []  # the command is gone; its container is not

        assert sorted(path.name for path in root.iterdir()) == ["gh-sbx-fresh", "gh-sbx-open", "gh-sbx-pinned"]
        for found in engine.containers.list(all=True, filters={"label": sandboxes.SANDBOX_LABEL}):
            found.remove(force=True)
        assert sweep() == ["gh-sbx-open"]
        # The fresh one goes when its 24 hours are up; the pinned one a week later.
        assert jobfiles.remove_unheld(root, timezone.now() + timedelta(hours=24), in_use=sandboxes.in_use) == [
            "gh-sbx-fresh"]
        assert (root / "gh-sbx-pinned" / "workspace").is_dir()
    finally:
        if opened.poll() is None:
            opened.kill()
        for found in engine.containers.list(all=True, filters={"label": sandboxes.SANDBOX_LABEL}):
            found.remove(force=True)


def test_no_folder_is_kept_with_retention_off(run_worker, settings):
    enqueue_spec(forge_spec("gh-sbx-off", body=""))
    run_worker("pi-jobs", env_overrides={**HOST, "PI_SANDBOX_RETENTION_HOURS": "0", "PI_KEEP_JOB_DIRS": "0"})

    assert Run.objects.get(job_id="gh-sbx-off").sandbox_until is None
    assert not (settings.PI_JOB_ROOT / "gh-sbx-off").exists()


def test_the_interactive_shell_answers_and_logs_out_when_idle(run_worker, worker_env, settings):
    finished_run(run_worker, settings, "gh-sbx-shell", body="")
    pid, terminal = pty.fork()
    if pid == 0:  # the operator's terminal
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "manage.py", "sandbox", "gh-sbx-shell"],
                  {**worker_env, **HOST, "PI_SANDBOX_IDLE_MINUTES": "1"})
    seen = b""
    # poll, not select: a long test process may hold descriptors past select()'s 1024 (its terminal's is then one).
    watch = select.poll()
    watch.register(terminal, select.POLLIN)

    def read(seconds: float) -> bool:
        nonlocal seen
        if watch.poll(seconds * 1000):
            try:
                seen += os.read(terminal, 4096)
            except OSError:  # the terminal closed: the command ended
                return False
        return True

    try:
        deadline = time.monotonic() + 60
        while b"$ " not in seen and b"# " not in seen and time.monotonic() < deadline:
            read(1)
        os.write(terminal, b"echo sum=$((40+2)); ls /workspace; id -u\n")
        deadline = time.monotonic() + 30
        while not (b"sum=42" in seen and b"README.md" in seen) and time.monotonic() < deadline:
            read(1)
        assert b"sum=42" in seen and b"README.md" in seen, seen.decode(errors="replace")
        last_input = time.monotonic()
        while time.monotonic() < last_input + 120 and os.waitpid(pid, os.WNOHANG) == (0, 0):
            read(1)
        idle = time.monotonic() - last_input
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.close(terminal)
    assert 55 < idle < 100, (idle, seen.decode(errors="replace"))
    assert not docker.from_env().containers.list(all=True, filters={"label": sandboxes.SANDBOX_LABEL})
