"""`make run`, for the person running it: a second shell finds its services, the summary says how to log in,
and a stop signal stops everything once, without a traceback, whatever signals follow.

The stack runs for real (`python -m devtools.stack run`) in a folder of its own (PI_VAR_DIR), with its own
private redis-server and dockerd and the demo image (the fake runner: seconds, not the real pi's minute).
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devtools import services
from pidispatch_site import dev_env

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_LINE = "press Ctrl-C (or send SIGTERM) to stop it all"
ADMIN_LINE = re.compile(r"==> admin: http://127\.0\.0\.1:\d+/admin/  user 'admin', password (\S+)  "
                        r"\(shown this once; reset it with `\S*python manage.py changepassword admin`\)\n")


def clean_env(var: Path, **extra) -> dict:
    """A second shell's environment: nothing of the test stack's (no REDIS_URL, no DOCKER_HOST)."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
            "PI_VAR_DIR": str(var), **extra}


def session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[3])


def processes_matching(*needles: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if all(needle in command for needle in needles):
                found.append(int(entry.name))
    return found


def started_by(var: Path) -> list[int]:
    """Every process a make run in `var` started, whatever session it made for itself: they all inherit
    its PI_VAR_DIR (web, worker, replayer, cron, dockerd and its containerd), or work inside `var`
    (redis-server, whose process title overwrites its environment)."""
    marker = f"PI_VAR_DIR={var}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                inherited = marker in (entry / "environ").read_bytes().split(b"\0")
                inside = Path(os.readlink(entry / "cwd").removesuffix(" (deleted)")).is_relative_to(var)
            except OSError:
                continue
            if inherited or inside:
                found.append(int(entry.name))
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"


def processes_in_sessions(sessions: set[int]) -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and session_of(int(entry.name)) in sessions]


class MakeRun:
    def __init__(self, var: Path):
        self.var = var
        env = clean_env(var, REDIS_URL=f"redis://127.0.0.1:{services.free_port()}/0",  # none there: its own
                        PI_JOB_IMAGE=services.DEMO_IMAGE, PI_PORT=str(services.free_port()), PI_JOB_MEMORY="256m")
        self.process = subprocess.Popen([sys.executable, "-m", "devtools.stack", "run"], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        try:
            for line in self.process.stdout:
                self.lines.append(line.decode(errors="replace"))
        except (ValueError, OSError):  # a test closed the pipe (its terminal went away)
            pass

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output:
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"make run never said {text!r}:\n{self.output}")

    def kill(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture
def make_run(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    # What a `make run` killed with SIGKILL leaves: its addresses, under a pid that is gone.
    (var / "dev.env").write_text("GITHUB_SELF_ID=1\nGITHUB_WEBHOOK_SECRET=kept-secret\n"
                                 "PIDISPATCH_STACK_PID=999999999\nREDIS_URL=redis://127.0.0.1:1/0\n")
    stack = MakeRun(var)
    yield stack
    # After a failed test: let it stop what it started, then kill whatever is left.
    if stack.process.poll() is None:
        stack.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            stack.process.wait(60)
    stack.kill()
    for pid in started_by(var):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for line in Path("/proc/mounts").read_text().splitlines():  # and a killed engine's mounts
        if f" {var}/" in line:
            subprocess.run(["umount", "-l", line.split()[1]], check=False)


def page_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_make_run_beside_a_second_shell_and_its_stop(make_run):
    make_run.wait_for_line("==> admin: ", timeout=240)
    time.sleep(3)  # whatever else it had to say
    output = make_run.output

    # The summary at the end says how to log in, and how to reset the password; it is shown only there, last:
    # no request of the web server's (its access log is a file) nor anything else comes after it.
    summary = output[output.index("\ndemo run "):]
    login = ADMIN_LINE.search(summary)
    assert login and summary.endswith(login.group(0)), summary
    assert output.count(login.group(1)) == 1
    assert SUMMARY_LINE in summary
    assert not any(line.startswith("[web]") and '"GET ' in line for line in make_run.lines), output
    assert "GET /healthz" in (make_run.var / "web-access.log").read_text()
    # The demo's pull request is a page on the stand-in, and the server's root leads to the admin.
    pull_page = re.search(r"published by the worker: published #\d+ on the local stand-in GitHub \(var/demo-forge\): "
                          r"(http://\S+/acme/web/pull/\d+)", summary).group(1)
    assert page_status(pull_page) == 200
    base_url = re.search(r"==> admin: (http://127\.0\.0\.1:\d+)/admin/", summary).group(1)
    with urllib.request.urlopen(f"{base_url}/", timeout=10) as response:
        assert response.url == f"{base_url}/admin/login/?next=/admin/"
    # pidispatch's worker lines show; RQ's own chatter does not.
    worker_lines = [line for line in make_run.lines if line.startswith("[worker]")]
    for chatter in ("Listening on", "Job OK", "started with PID", "Result is kept", "Cleaning registries"):
        assert not any(chatter in line for line in worker_lines), worker_lines

    # var/dev.env: the kept secret stays, the stale address is replaced by the private Redis's.
    written = dev_env.read(make_run.var / "dev.env")
    assert written.kept["GITHUB_WEBHOOK_SECRET"] == "kept-secret"
    assert written.services["GITLAB_URL"] == written.services["GITHUB_API_URL"]  # one stand-in plays all four
    assert written.stack_pid == make_run.process.pid
    port = re.search(r"starting a private redis-server on 127\.0\.0\.1:(\d+)", output).group(1)
    assert written.services["REDIS_URL"] == f"redis://127.0.0.1:{port}/0"
    assert written.services["DOCKER_HOST"].startswith("unix:///")

    # A second shell, with none of make run's environment, finds its Redis and sees its worker.
    status = subprocess.run([sys.executable, "manage.py", "fleet", "status", "--json"], cwd=ROOT,
                            env=clean_env(make_run.var), capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    hosts = json.loads(status.stdout)["hosts"]
    assert [host["liveness"] for host in hosts] == ["live"] and "pi-jobs" in hosts[0]["queues"]
    # The real environment wins over the file.
    elsewhere = f"redis://127.0.0.1:{services.free_port()}/0"
    status = subprocess.run([sys.executable, "manage.py", "fleet", "status"], cwd=ROOT,
                            env=clean_env(make_run.var, REDIS_URL=elsewhere), capture_output=True, text=True,
                            timeout=60)
    assert status.returncode != 0 and f"could not reach Redis at {elsewhere}" in status.stderr

    # The second shell tries a GitLab trigger: signed with the deployment's own secret, posted to the running
    # server, queued; the worker runs it on a clone from the stand-in, which then has the merge request's page.
    sent = subprocess.run([sys.executable, "manage.py", "send_delivery", "--forge", "gitlab", "--label", "pi",
                           "--number", "12", "--wait", "90"], cwd=ROOT, env=clean_env(make_run.var),
                          capture_output=True, text=True, timeout=120)
    assert sent.returncode == 0, sent.stderr
    assert re.search(rf"^sent gitlab issue \(#12, delivery sample-\S+\) to {base_url}/hooks/gitlab: HTTP 202$",
                     sent.stdout, re.MULTILINE), sent.stdout
    assert re.search(r"^queued: gl-sample-\S+$", sent.stdout, re.MULTILINE), sent.stdout
    # It follows the job to its run: the outcome, the merge request and the run's page.
    assert re.search(rf"^gl-sample-\S+: completed, published \S+/merge_requests/\d+: {base_url}/admin/worker/run/\d+/"
                     r"change/$", sent.stdout, re.MULTILINE), sent.stdout
    gitlab_url = dev_env.read(make_run.var / "dev.env").services["GITLAB_URL"]
    merge_request = f"{gitlab_url}/acme/shop/storefront/-/merge_requests/41"
    deadline = time.monotonic() + 90
    while page_status(merge_request) != 200 and time.monotonic() < deadline:
        time.sleep(1)
    assert page_status(merge_request) == 200, make_run.output

    # A second make run in the same checkout would share its data folders: it refuses, and changes nothing.
    second = subprocess.run([sys.executable, "-m", "devtools.stack", "run"], cwd=ROOT, env=clean_env(make_run.var),
                            capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert f"make run is running in this checkout already (pid {make_run.process.pid})" in second.stderr
    assert dev_env.read(make_run.var / "dev.env") == written

    # Its private engine and Redis, and everything they started (containerd), by session.
    engine = processes_matching(b"dockerd", f"{make_run.var}/docker".encode())
    redis = processes_matching(b"redis-server", f"127.0.0.1:{port}".encode())  # it names itself so
    assert len(engine) == 1 and len(redis) == 1
    sessions = {session_of(engine[0]), session_of(redis[0])}

    # SIGTERM, as a service manager sends it, then more while it cleans up: handled once, the rest ignored.
    make_run.process.send_signal(signal.SIGTERM)
    make_run.wait_for_line("SIGTERM received: stopping", timeout=10)
    make_run.process.send_signal(signal.SIGTERM)
    make_run.process.send_signal(signal.SIGINT)
    assert make_run.process.wait(120) == 0
    make_run._reader.join(5)
    assert "Traceback" not in make_run.output, make_run.output
    assert make_run.output.count("received: stopping") == 1
    assert processes_in_sessions(sessions) == []
    assert started_by(make_run.var) == []  # nor the web server, the worker, the replayer or cron
    assert f" {make_run.var}/" not in Path("/proc/mounts").read_text()  # the engine's mounts went with it
    assert not services._short_run_dir(make_run.var / "docker").exists()  # and its runtime folder under /run
    # Nothing beside it is sent to the Redis that is gone; the demo's secret is kept for the next run.
    after = dev_env.read(make_run.var / "dev.env")
    assert after.services == {} and after.stack_pid is None
    assert after.kept["GITHUB_WEBHOOK_SECRET"] == "kept-secret"


def settings_redis_url(var: Path, **extra) -> str:
    return subprocess.run(
        [sys.executable, "-c", "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'pidispatch_site.settings';"
         "from django.conf import settings; print(settings.REDIS_URL)"],
        cwd=ROOT, env=clean_env(var, **extra), capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def test_settings_read_the_addresses_only_while_their_make_run_lives(tmp_path):
    var = tmp_path / "var"
    var.mkdir()
    # A process whose command line is make run's (`... devtools.stack run`), standing in for it.
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "devtools.stack", "run"])
    try:
        dev_env.write(var / "dev.env", {"GITHUB_SELF_ID": "1"}, {"REDIS_URL": "redis://127.0.0.1:7777/0"},
                      stand_in.pid)
        assert settings_redis_url(var) == "redis://127.0.0.1:7777/0"
        assert settings_redis_url(var, REDIS_URL="redis://10.0.0.9:6379/0") == "redis://10.0.0.9:6379/0"
    finally:
        stand_in.kill()
        stand_in.wait(30)
    # Gone (killed without its cleanup): its address is ignored, the default applies.
    assert settings_redis_url(var) == "redis://127.0.0.1:6379/0"


def test_a_stop_while_it_starts_its_engine_leaves_nothing_running(make_run):
    """Ctrl-C while the private dockerd comes up (seconds, the likeliest moment to give up waiting): the engine
    it has just started is stopped too, and the signals that follow change nothing."""
    make_run.wait_for_line("the engine stores images with", timeout=120)
    time.sleep(0.3)  # dockerd is spawned now, and not answering yet
    port = re.search(r"starting a private redis-server on 127\.0\.0\.1:(\d+)", make_run.output).group(1)
    run_dir = services._short_run_dir(make_run.var / "docker")
    assert processes_matching(b"dockerd", str(run_dir).encode())
    make_run.process.send_signal(signal.SIGINT)
    # Then more, while it stops (sent together with the first, the kernel may hand the SIGTERM over first).
    deadline = time.monotonic() + 30
    while ("received: stopping" not in make_run.output and make_run.process.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.05)
    assert "SIGINT received: stopping" in make_run.output, make_run.output  # the first signal alone stops it
    make_run.process.send_signal(signal.SIGINT)
    make_run.process.send_signal(signal.SIGTERM)
    assert make_run.process.wait(120) == 0
    make_run._reader.join(5)
    assert "SIGINT received: stopping" in make_run.output and "Traceback" not in make_run.output, make_run.output
    assert processes_matching(str(run_dir).encode()) == []  # dockerd and its containerd
    assert processes_matching(b"redis-server", f"127.0.0.1:{port}".encode()) == []
    assert started_by(make_run.var) == []
    assert dev_env.read(make_run.var / "dev.env").services == {}


def test_a_closed_terminal_stops_it_all(make_run):
    """SIGHUP, as when its terminal (or ssh session) closes: nothing can be printed any more, and the cleanup
    still runs to the end."""
    make_run.wait_for_line("the engine stores images with", timeout=120)
    time.sleep(0.3)
    port = re.search(r"starting a private redis-server on 127\.0\.0\.1:(\d+)", make_run.output).group(1)
    run_dir = services._short_run_dir(make_run.var / "docker")
    make_run.process.stdout.close()  # the terminal is gone: every write of make run's now fails
    make_run.process.send_signal(signal.SIGHUP)
    assert make_run.process.wait(120) == 0
    assert processes_matching(str(run_dir).encode()) == []
    assert processes_matching(b"redis-server", f"127.0.0.1:{port}".encode()) == []
    left = started_by(make_run.var)
    assert left == [], [command_line(pid) for pid in left]  # which one, when it is not gone
    assert dev_env.read(make_run.var / "dev.env").services == {}
