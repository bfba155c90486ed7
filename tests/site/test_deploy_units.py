"""The systemd units of contrib/systemd/, proved: each one's ExecStart runs as systemd would run it (its Environment=,
then its EnvironmentFile= read, its specifiers filled in, its state and runtime directories made) against the test
stack's Redis, database and Docker engine; it serves, or works a job, and on its KillSignal, sent as its KillMode
says, it exits cleanly within its TimeoutStopSec (the worker also with the pool drop-in docs/deploying.md gives).
contrib/nginx/pidispatch.conf runs in front of the two web units, and `systemd-analyze verify` passes on each unit,
where nginx and systemd-analyze are installed (skipped, saying so, where not).

systemd is not PID 1 here, so the units run as plain subprocesses of the test (as root, not as User=pidispatch), with
the install's paths mapped to this checkout (/opt/pidispatch) and to the test's own environment files
(/etc/pidispatch/), and %S and %t to folders of the test's own.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from rq import Queue

from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run
from devtools import services
from tests.conftest import ROOT, SELF_ID, WEBHOOK_SECRET, github_payload, wait_for
from tests.receiver_support import github_headers
from tests.settings_source import literal_defaults

pytestmark = pytest.mark.django_db(transaction=True)

UNITS = ROOT / "contrib" / "systemd"
NGINX_SITE = ROOT / "contrib" / "nginx" / "pidispatch.conf"
PUBLIC_NAME, PRIVATE_NAME = "hooks.example.com", "pi.example.internal"
INSTALL_PREFIX = "/opt/pidispatch"
CONFIG_DIR = "/etc/pidispatch/"
INSTANCE = "deploy-test"
PROVED = {"pidispatch-web.service", "pidispatch-edge.service", "pidispatch-worker@.service",
          "pidispatch-replayer.service", "pidispatch-cron@.service", "pidispatch-notify.service",
          "pidispatch-poller.service"}


# --- reading a unit as systemd does ------------------------------------------------------------------------------

@dataclass
class UnitFile:
    """A unit file's sections, each key with every value it was given in order (systemd keys repeat)."""

    name: str
    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path, *drop_ins: str) -> UnitFile:
        """The unit file, then its drop-ins' text (`systemctl edit`), whose settings come after its own."""
        unit = cls(path.name)
        section = None
        text = re.sub(r"\\\n", " ", "\n".join([path.read_text(), *drop_ins]))  # a trailing backslash continues
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = unit.sections.setdefault(line[1:-1], [])
            elif "=" in line and section is not None:
                key, value = line.split("=", 1)
                section.append((key.strip(), value.strip()))
            else:
                raise AssertionError(f"{path.name}:{number}: not a unit file line: {line!r}")
        return unit

    def values(self, section: str, key: str) -> list[str]:
        """Every value given, in order; an empty assignment (`ExecStart=`) drops the ones before it."""
        found: list[str] = []
        for name, value in self.sections.get(section, []):
            if name == key:
                found = found + [value] if value else []
        return found

    def get(self, section: str, key: str, default: str | None = None) -> str | None:
        found = self.values(section, key)
        return found[-1] if found else default


def seconds(span: str) -> float:
    """A systemd time span: `90`, `45min`, `1h 30min`, `2700s`."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and re.fullmatch(r"(\s*\d+(\.\d+)?\s*[a-z]*)+\s*", span), span
    return sum(float(amount) * units[unit or "s"] for amount, unit in parts)


@dataclass
class Launch:
    """What systemd would do for one unit: the command, its environment and folders, its stop."""

    unit: UnitFile
    command: list[str]
    env: dict[str, str]
    cwd: Path
    kill_signal: signal.Signals
    kill_mode: str
    stop_timeout: float
    runtime_dirs: list[Path]


class Systemd:
    """Specifiers, directories and environment files for the units, in folders of the test's own."""

    def __init__(self, scratch: Path, short: Path):
        self.config = scratch / "etc"
        self.state_root = scratch / "state"
        self.runtime_root = short / "run"  # short: the egress sockets' paths must stay under 108 bytes
        for folder in (self.config, self.state_root, self.runtime_root):
            folder.mkdir(parents=True)

    def specifiers(self, unit_name: str, instance: str) -> dict[str, str]:
        prefix = unit_name.split("@")[0].removesuffix(".service")
        full = f"{prefix}@{instance}.service" if "@" in unit_name else unit_name
        return {"i": instance, "I": instance, "n": full, "N": full.removesuffix(".service"), "p": prefix,
                "t": str(self.runtime_root), "S": str(self.state_root), "%": "%"}

    def expand(self, text: str, specifiers: dict[str, str]) -> str:
        def one(match):
            assert match.group(1) in specifiers, f"specifier %{match.group(1)} is not emulated here"
            return specifiers[match.group(1)]
        return re.sub(r"%(.)", one, text)

    def mapped(self, path: str) -> str:
        if path.startswith(INSTALL_PREFIX):
            return str(ROOT) + path[len(INSTALL_PREFIX):]
        if path.startswith(CONFIG_DIR):
            return str(self.config / path[len(CONFIG_DIR):])
        return path

    def launch(self, unit: UnitFile, instance: str = INSTANCE, notify_socket: str | None = None) -> Launch:
        specifiers = self.specifiers(unit.name, instance)
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/root")}
        for assignments in unit.values("Service", "Environment"):
            for assignment in shlex.split(self.expand(assignments, specifiers)):
                key, _, value = assignment.partition("=")
                env[key] = value
        for entry in unit.values("Service", "EnvironmentFile"):
            optional = entry.startswith("-")
            path = Path(self.mapped(self.expand(entry.lstrip("-"), specifiers)))
            if not path.exists():
                assert optional, f"{unit.name}: EnvironmentFile {path} is required and missing"
                continue
            env.update(read_environment_file(path))
        state_mode = int(unit.get("Service", "StateDirectoryMode", "0755"), 8)
        for name in " ".join(unit.values("Service", "StateDirectory")).split():
            folder = self.state_root / self.expand(name, specifiers)
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(state_mode)
            env["STATE_DIRECTORY"] = str(folder)
        runtime_dirs = []
        runtime_mode = int(unit.get("Service", "RuntimeDirectoryMode", "0755"), 8)
        for name in " ".join(unit.values("Service", "RuntimeDirectory")).split():
            folder = self.runtime_root / self.expand(name, specifiers)
            folder.mkdir(parents=True)
            folder.chmod(runtime_mode)
            runtime_dirs.append(folder)
            env["RUNTIME_DIRECTORY"] = str(folder)
        if notify_socket:
            env["NOTIFY_SOCKET"] = notify_socket
        (exec_start,) = unit.values("Service", "ExecStart")
        command = [self.mapped(word) for word in shlex.split(self.expand(exec_start.lstrip("-@:+!"), specifiers))]
        command = [substitute(word, env) for word in command]
        return Launch(unit=unit, command=command, env=env,
                      cwd=Path(self.mapped(unit.get("Service", "WorkingDirectory", "/"))),
                      kill_signal=signal.Signals[unit.get("Service", "KillSignal", "SIGTERM")],
                      kill_mode=unit.get("Service", "KillMode", "control-group"),
                      stop_timeout=seconds(unit.get("Service", "TimeoutStopSec", "90")),
                      runtime_dirs=runtime_dirs)


def read_environment_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and line[0] not in "#;":
            key, _, value = line.partition("=")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            values[key.strip()] = value
    return values


def substitute(word: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), word)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Running:
    """One unit's process, in a session of its own, with its output in a file."""

    def __init__(self, launch: Launch, log: Path):
        self.launch = launch
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 (the unit's log, closed when it stops)
        self.process = subprocess.Popen(launch.command, cwd=launch.cwd, env=launch.env, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop_as_systemd(self) -> tuple[int, float]:
        """The unit's KillSignal to the main process (KillMode=mixed, process) or to all of it (control-group);
        how it exited and how long it took. Past TimeoutStopSec (or two minutes here) it fails."""
        started = time.monotonic()
        if self.launch.kill_mode in ("mixed", "process"):
            self.process.send_signal(self.launch.kill_signal)
        else:  # the unit's cgroup: every process it started, whatever session it made for itself
            for pid in [self.process.pid, *descendants(self.process.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, self.launch.kill_signal)
        try:
            code = self.process.wait(timeout=min(self.launch.stop_timeout, 120))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.launch.unit.name} did not stop within its TimeoutStopSec:\n{self.output()}") from None
        for folder in self.launch.runtime_dirs:  # what systemd does once the unit has stopped
            shutil.rmtree(folder)
        return code, time.monotonic() - started

    def kill(self):
        for pid in [*descendants(self.process.pid), self.process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self._log.close()


# --- the test's systemd ------------------------------------------------------------------------------------------

@pytest.fixture
def units(tmp_path, worker_env):
    """The units under a stand-in systemd whose /etc/pidispatch/pidispatch.env points at the test's services."""
    short = Path(tempfile.mkdtemp(prefix="pd-units-", dir="/tmp"))
    systemd = Systemd(tmp_path, short)
    keep = ("DATABASE_URL", "REDIS_URL", "DOCKER_HOST", "PI_JOB_IMAGE", "PI_JOB_MEMORY", "PI_HOST_CPU_BUDGET",
            "GITHUB_API_URL",
            "GITHUB_TOKEN", "PI_PROVIDER", "ANTHROPIC_API_KEY")
    lines = [f"{key}={worker_env[key]}" for key in keep if worker_env.get(key)]
    lines += ["# the test stack's own, as `make test` sets it for every process",
              f"GITHUB_WEBHOOK_SECRET={WEBHOOK_SECRET}", f"GITHUB_SELF_ID={SELF_ID}", "DATABASE_CONN_MAX_AGE=0",
              "PI_WEB_WORKERS=2",
              "# no worker's daily housekeeping pruning the shared test database beside the test (as worker_env)",
              "PI_HOUSEKEEPING_DAILY=false"]
    (systemd.config / "pidispatch.env").write_text("\n".join(lines) + "\n")
    started: list[Running] = []

    def start(name: str, *drop_ins: str, **launch_options) -> Running:
        running = Running(systemd.launch(UnitFile.read(UNITS / name, *drop_ins), **launch_options),
                          tmp_path / f"{name}.log")
        started.append(running)
        return running

    start.systemd = systemd
    yield start
    for running in started:
        running.kill()
    shutil.rmtree(short, ignore_errors=True)


class NotifySocket:
    """systemd's end of sd_notify, for Type=notify units: READY=1 is when the unit counts as started."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(self.path)

    def wait_ready(self, running: Running, timeout: float = 60) -> None:
        self.socket.settimeout(0.5)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert running.process.poll() is None, f"it exited before it was ready:\n{running.output()}"
            try:
                if b"READY=1" in self.socket.recv(4096).split(b"\n"):
                    return
            except TimeoutError:
                continue
        raise AssertionError(f"no READY=1 within {timeout} s:\n{running.output()}")




def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def serve(units, name: str, env_file: str, port: int | None = None) -> tuple[Running, str]:
    """A gunicorn unit on a free port (its own environment file says where), started once it says READY=1."""
    port = port or services.free_port()
    (units.systemd.config / env_file).write_text(f"PI_WEB_BIND=127.0.0.1:{port}\n")
    ready = NotifySocket(units.systemd.runtime_root / f"notify-{name}")
    unit = UnitFile.read(UNITS / name)
    assert unit.get("Service", "Type") == "notify"
    running = units(name, notify_socket=ready.path)
    ready.wait_ready(running)
    return running, f"http://127.0.0.1:{port}"


def assert_clean_stop(running: Running, code: int = 0) -> float:
    returncode, took = running.stop_as_systemd()
    assert returncode == code, f"{running.launch.unit.name} exited {returncode}:\n{running.output()}"
    assert "Traceback" not in running.output(), running.output()
    return took


# --- the web server and the edge -----------------------------------------------------------------------------------

def test_the_web_server_serves_the_admin_and_stops_on_sigterm_within_its_timeout(units):
    gunicorn = runpy.run_path(str(ROOT / "contrib" / "gunicorn.conf.py"))
    unit = UnitFile.read(UNITS / "pidispatch-web.service")
    assert unit.get("Service", "KillMode") == "mixed"  # the master alone: it stops its workers gracefully
    assert seconds(unit.get("Service", "TimeoutStopSec")) > gunicorn["graceful_timeout"]

    web, base = serve(units, "pidispatch-web.service", "web.env")
    status, body = get(f"{base}/healthz")
    assert (status, json.loads(body)) == (200, {"db": "ok", "redis": "ok"})
    assert get(f"{base}/admin/login/")[0] == 200
    assert get(f"{base}/api/v1/runs")[0] == 401  # the private server serves the API

    took = assert_clean_stop(web)
    assert took < gunicorn["graceful_timeout"]
    assert (units.systemd.state_root / "pidispatch" / "secret_key").exists()  # PI_VAR_DIR=%S/pidispatch
    assert '"GET /healthz HTTP/1.1" 200' in web.output()  # the access log, to the journal


def test_the_edge_serves_only_webhooks_whatever_its_environment_files_say(units, label_trigger):
    with (units.systemd.config / "pidispatch.env").open("a") as env_file:
        env_file.write("PI_PUBLIC_EDGE=false\n")
    edge, base = serve(units, "pidispatch-edge.service", "edge.env")

    assert get(f"{base}/healthz")[0] == 200
    for private in ("/admin/", "/admin/login/", "/api/v1/runs", "/metrics"):
        assert get(f"{base}{private}")[0] == 404, private
    body = github_payload()
    request = urllib.request.Request(f"{base}/hooks/github", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **github_headers(body, "issues", "edge-1")})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 202 and json.loads(answer.read())["status"] == "queued"

    assert_clean_stop(edge)


# --- both behind the reverse proxy's example ----------------------------------------------------------------------

def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
                   .sign(key, hashes.SHA256()))
    chain, private = folder / f"{name}.pem", folder / f"{name}.key"
    chain.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return chain, private


class Proxy:
    """contrib/nginx/pidispatch.conf under a private nginx: its ports, certificates and upstreams the test's."""

    def __init__(self, folder: Path, upstreams: dict[int, int]):
        self.folder = folder
        (folder / "logs").mkdir()
        self.http_port, self.https_port = services.free_port(), services.free_port()
        site = NGINX_SITE.read_text()
        site = re.sub(r"\n\s*listen \[::\]:\d+[^;]*;", "", site)  # IPv4 here
        site = site.replace("listen 80;", f"listen 127.0.0.1:{self.http_port};")
        site = site.replace("listen 443 ", f"listen 127.0.0.1:{self.https_port} ")
        self.trust = ssl.create_default_context()
        for name in (PUBLIC_NAME, PRIVATE_NAME):
            chain, private = self_signed(folder, name)
            site = site.replace(f"/etc/letsencrypt/live/{name}/fullchain.pem", str(chain))
            site = site.replace(f"/etc/letsencrypt/live/{name}/privkey.pem", str(private))
            self.trust.load_verify_locations(chain)
        for installed, test_port in upstreams.items():
            site = site.replace(f"server 127.0.0.1:{installed};", f"server 127.0.0.1:{test_port};")
        (folder / "site.conf").write_text(site)
        (folder / "nginx.conf").write_text(
            f"pid {folder}/nginx.pid;\nerror_log {folder}/logs/error.log;\nevents {{}}\n"
            f"http {{\n    access_log off;\n    client_body_temp_path {folder}/body;\n"
            f"    proxy_temp_path {folder}/proxy;\n    include {folder}/site.conf;\n}}\n")
        command = ["nginx", "-p", str(folder), "-c", str(folder / "nginx.conf"), "-g", "daemon off;"]
        checked = subprocess.run([*command[:-2], "-t"], capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for(lambda: self._listening(), timeout=15, what="nginx")

    def _listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.https_port), timeout=1).close()
            return True
        except OSError:
            return False

    def request(self, name: str, method: str, path: str, body: bytes | None = None, headers=None, tls=True):
        if tls:
            connection = http.client.HTTPSConnection("127.0.0.1", self.https_port, timeout=10, context=self.trust)
            raw = socket.create_connection(("127.0.0.1", self.https_port), timeout=10)
            connection.sock = self.trust.wrap_socket(raw, server_hostname=name)  # SNI and the name checked
        else:
            connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        connection.request(method, path, body=body, headers={"Host": name, **(headers or {})})
        answer = connection.getresponse()
        answer.body = answer.read()
        connection.close()
        return answer

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # nginx's graceful stop
            self.process.wait(timeout=30)


def test_the_edge_and_the_web_server_behind_the_nginx_example(units, tmp_path, label_trigger):
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (Debian's nginx package has it)")
    with (units.systemd.config / "pidispatch.env").open("a") as env_file:
        env_file.write(f"DJANGO_SECURE=true\nDJANGO_ALLOWED_HOSTS={PUBLIC_NAME},{PRIVATE_NAME}\n"
                       f"DJANGO_CSRF_TRUSTED_ORIGINS=https://{PRIVATE_NAME}\n")
    edge_port, web_port = services.free_port(), services.free_port()
    edge, _ = serve(units, "pidispatch-edge.service", "edge.env", port=edge_port)
    web, _ = serve(units, "pidispatch-web.service", "web.env", port=web_port)
    (tmp_path / "nginx").mkdir()
    proxy = Proxy(tmp_path / "nginx", {8001: edge_port, 8000: web_port})
    try:
        health = proxy.request(PUBLIC_NAME, "GET", "/healthz")
        assert (health.status, json.loads(health.body)) == (200, {"db": "ok", "redis": "ok"})
        assert proxy.request(PUBLIC_NAME, "GET", "/admin/login/").status == 404
        body = github_payload()
        hook = proxy.request(PUBLIC_NAME, "POST", "/hooks/github", body,
                             {"Content-Type": "application/json", **github_headers(body, "issues", "proxied-1")})
        assert hook.status == 202, hook.body
        too_large = proxy.request(PUBLIC_NAME, "POST", "/hooks/github", b"x" * (2 * 1024 * 1024 + 1),
                                  {"Content-Type": "application/json"})
        assert too_large.status == 413

        # The private name: the admin, over HTTPS as Django sees it (the proxy's X-Forwarded-Proto).
        login = proxy.request(PRIVATE_NAME, "GET", "/admin/login/", headers={"X-Forwarded-Proto": "http"})
        assert login.status == 200
        assert login.getheader("Strict-Transport-Security", "").startswith("max-age=")
        assert "; Secure" in login.getheader("Set-Cookie", "")
        redirect = proxy.request(PRIVATE_NAME, "GET", "/admin/", tls=False)
        assert (redirect.status, redirect.getheader("Location")) == (308, f"https://{PRIVATE_NAME}/admin/")
    finally:
        proxy.stop()
    assert_clean_stop(edge)
    assert_clean_stop(web)


# --- the worker ------------------------------------------------------------------------------------------------------

def settings_default(name: str) -> int:
    return int(literal_defaults()[name])


def issue(post_github, number: int, text: str) -> str:
    """A signed delivery of issue `number` labelled for a run; the job it queued."""
    payload = json.loads(github_payload(body_text=text))
    payload["issue"]["number"] = number
    response = post_github(json.dumps(payload).encode(), delivery=f"unit-{number}")
    assert response.status_code == 202, response.content
    (job_id,) = response.json()["jobs"]
    return job_id


def documented_pool_drop_in() -> str:
    """The drop-in docs/deploying.md gives for several worker processes on one host."""
    guide = (ROOT / "docs" / "deploying.md").read_text()
    section = guide[guide.index("**Several workers on one host.**"):]
    return re.search(r"```ini\n(.*?)```", section, re.DOTALL).group(1)


@pytest.mark.docker
@pytest.mark.parametrize("pool", [False, True], ids=["one-process", "the-guide-s-pool-drop-in"])
def test_a_worker_works_a_job_and_its_stop_lets_the_running_job_end(units, post_github, label_trigger, redis_conn,
                                                                    github_stand_in, pool):
    drop_ins = [documented_pool_drop_in()] if pool else []
    unit = UnitFile.read(UNITS / "pidispatch-worker@.service", *drop_ins)
    # systemd never kills a running job as lost: the stop waits longer than a job may take.
    budget = sum(settings_default(name) for name in ("PI_JOB_TIMEOUT_SECONDS", "PI_CLONE_TIMEOUT_SECONDS",
                                                     "PI_REDIS_OUTAGE_SECONDS"))
    assert seconds(unit.get("Service", "TimeoutStopSec")) > budget
    # SIGTERM to the main process only: the work horse (the job, its gateway) dies of a SIGTERM of its own.
    assert unit.get("Service", "KillMode") == "mixed"

    worker = units("pidispatch-worker@.service", *drop_ins)
    assert ("rqworker-pool" in worker.launch.command) == pool
    (egress,) = worker.launch.runtime_dirs
    assert worker.launch.env["PI_EGRESS_SOCKET_DIR"] == str(egress) and egress.stat().st_mode & 0o777 == 0o700
    running_jobs = [issue(post_github, 7, "fake-agent:sleep=4")]
    if pool:  # two processes of the pool busy at once
        running_jobs.append(issue(post_github, 8, "fake-agent:sleep=4"))
    waiting_job = None if pool else issue(post_github, 8, "Another one.")
    wait_for(lambda: len(list(egress.iterdir())) == len(running_jobs), timeout=90,
             what="each running job's gateway sockets in the runtime directory")

    code, _ = worker.stop_as_systemd()
    assert code == 0, worker.output()
    for job_id in running_jobs:
        run = Run.objects.get(job_id=job_id)
        assert (run.outcome, run.host) == (Outcome.COMPLETED, INSTANCE), (run.reason, worker.output())
    if waiting_job:
        assert Queue("pi-jobs", connection=redis_conn).get_job_ids() == [waiting_job]  # it took no other job
        assert not Run.objects.filter(job_id=waiting_job).exists()
    assert "cold shut down" not in worker.output()


# --- the inbox replayer and the cron producer ----------------------------------------------------------------------

def test_the_replayer_and_the_cron_producer_work_and_stop_on_sigterm(units, tmp_path, redis_conn):
    folder = tmp_path / "scheduled"
    folder.mkdir()
    trigger = Trigger.objects.create(position=0, on_type="cron", cron_id="every-second", cron_pattern="* * * * * *",
                                     kind="local", folder=str(folder), flow="tidy", task="Tidy up.")
    replayer = units("pidispatch-replayer.service")
    cron = units("pidispatch-cron@.service")
    assert cron.launch.env["PI_WORKER_NAME"] == INSTANCE

    fired = wait_for(lambda: Queue(f"pi-jobs@{INSTANCE}", connection=redis_conn).get_job_ids(), timeout=60,
                     what="a cron job on the instance's host queue")
    assert fired[0].startswith(f"cron-{trigger.pk}-")
    wait_for(lambda: "replaying the inbox every" in replayer.output(), timeout=30, what="the replayer's start")

    for running in (replayer, cron):
        assert_clean_stop(running)


def test_the_notification_sender_delivers_and_stops_on_sigterm(units):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from apps.notifications import services
    from apps.notifications.models import Endpoint, Event, Notification, NotificationStatus

    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        Endpoint.objects.create(name="ops", url=f"http://127.0.0.1:{server.server_address[1]}/")
        [notification] = services.notify(Event.FAILURE, "gh-unit-1", {"jobId": "gh-unit-1", "outcome": "failed"})
        # The receiver is on loopback: an internal host, which the sender reaches only where the host names it.
        (units.systemd.config / "notify.env").write_text("PI_NOTIFY_INTERNAL_HOSTS=127.0.0.1\n")
        sender = units("pidispatch-notify.service")

        wait_for(lambda: Notification.objects.get(pk=notification.pk).status == NotificationStatus.DELIVERED,
                 timeout=60, what="the sender to deliver the notification")
        assert len(received) == 1 and b"gh-unit-1" in received[0]
        assert "delivering notifications from pi-notify" in sender.output()
        assert_clean_stop(sender)
    finally:
        server.shutdown()
        server.server_close()


def test_the_poller_polls_its_repositories_and_stops_on_sigterm(units, fake_forge, label_trigger, redis_conn):
    feeds = fake_forge.github_issue_feeds("acme/web")
    (units.systemd.config / "poller.env").write_text(f"POLL_REPOS=acme/web\nGITHUB_API_URL={fake_forge.url}\n")
    poller = units("pidispatch-poller.service")

    wait_for(lambda: "polling acme/web every 60 s" in poller.output(), timeout=30, what="the poller's start")
    wait_for(lambda: "poll_armed repo=acme/web" in poller.output(), timeout=30, what="the repository armed")
    assert any(request["path"] == "/repos/acme/web/issues/events" for request in fake_forge.requests)
    assert_clean_stop(poller)
    assert "poller stopped" in poller.output()
    assert feeds.events == []


def test_a_malformed_poll_repos_stops_the_poller_for_good(units):
    (units.systemd.config / "poller.env").write_text("POLL_REPOS=acme\n")
    poller = units("pidispatch-poller.service")

    returncode = poller.process.wait(timeout=60)

    assert returncode == 2 and str(returncode) in UnitFile.read(UNITS / "pidispatch-poller.service").get(
        "Service", "RestartPreventExitStatus").split()
    assert "POLL_REPOS: 'acme' is not a GitHub repository name" in poller.output()


def test_every_unit_is_proved_here():
    assert {path.name for path in UNITS.glob("*.service")} == PROVED


# --- systemd's own check -------------------------------------------------------------------------------------------

def test_systemd_analyze_verify_passes_on_each_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package has it)")
    systemd = Systemd(tmp_path, tmp_path)
    (systemd.config / "pidispatch.env").write_text("")
    copies = []
    for path in sorted(UNITS.iterdir()):
        # The install's paths mapped to this checkout, so that verify finds the programs ExecStart names.
        text = path.read_text().replace(INSTALL_PREFIX, str(ROOT)).replace(CONFIG_DIR, f"{systemd.config}/")
        copy = tmp_path / path.name.replace("@.", f"@{INSTANCE}.")
        copy.write_text(text)
        copies.append(str(copy))
    result = subprocess.run([analyze, "verify", "--man=no", *copies], capture_output=True, text=True, timeout=60)
    complaints = [line for line in result.stderr.splitlines() if str(tmp_path) in line]
    assert result.returncode == 0 and not complaints, result.stderr
