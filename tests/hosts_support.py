"""A fleet of worker hosts on one machine, for the drills in tests/hosts/: each host in a network namespace of
its own, reached over a veth pair, with its own address, its own Docker engine (data root and socket), its own
job folders and its own `PI_WORKER_NAME`; the services in the root namespace.

    root namespace                                   host namespaces (hostA, hostB, hostC)
    10.231.0.1/32 on lo (the services' address)        10.231.<i>.2/30 on eth0, default route via 10.231.<i>.1
      redis-server (append-only), the database           dockerd (var/fleet-docker/<host>, /run/pidispatch-fleet/)
      (relayed to its loopback port), the stand-in       `manage.py rqworker pi-jobs pi-jobs@<host>`, restarted
      GitHub and the scripted model                       when it exits, as a service manager would
      gunicorn, the inbox replayer, the cron producer
    pdf-<host>: 10.231.<i>.1/30, the host's link: down = the host is cut off

A host reaches nothing but the services' address: no other host, no address of the machine's own. Everything
made here (namespaces, links, the services' address, engines, processes) is removed when the fleet stops, by the
fixture's teardown or at exit; a run that was killed leaves names only this module uses, and the next run
removes them first. Only one fleet runs on a machine at a time (a lock under /run).

Needs root and PostgreSQL: the fixture skips, saying why, without them (`.ci/run` runs this part once, on
PostgreSQL).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import docker
import pytest

from devtools import fake_forge, services
from tests.receiver_support import GITHUB_SECRET, STAND_IN_TOKEN, github_headers

ROOT = Path(__file__).resolve().parent.parent
SERVICES_ADDRESS = "10.231.0.1"
NAMESPACE_PREFIX = "pidispatch-fleet-"
LINK_PREFIX = "pdf-"
RUN_DIR = Path("/run/pidispatch-fleet")
LOCK = Path("/run/pidispatch-fleet.lock")
HOST_NAMES = ("hostA", "hostB", "hostC")
SELF_ID = "424242"
PROVIDER_KEY = "sk-fleet-provider-key"
# Registry intervals in seconds, so a dead host's row goes stale within a drill.
FAST_FLEET = {"PI_FLEET_BEAT_SECONDS": "0.5", "PI_FLEET_ROW_TTL_SECONDS": "6", "PI_FLEET_LIVE_SECONDS": "3",
              "PI_FLEET_CANCEL_ACK_SECONDS": "15", "PI_FLEET_ROUTE_CACHE_SECONDS": "0"}


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def why_not() -> str:
    """Why this machine cannot run the fleet ("" when it can)."""
    from django.db import connection

    if os.geteuid() != 0:
        return "the fleet drills need root (network namespaces, veth links, a Docker engine per host)"
    if connection.vendor != "postgresql":
        return ("the fleet drills run on PostgreSQL, the database of a multi-host deployment (.ci/run's second "
                "pass: make test DB=postgres)")
    for binary in ("ip", "nsenter", "dockerd"):
        if shutil.which(binary) is None:
            return f"the fleet drills need `{binary}` on this machine"
    return ""


# --- the wires ----------------------------------------------------------------------------------------------

class Relay:
    """A TCP relay from the services' address to a loopback port (the database listens on loopback only): every
    connection a host opens crosses its veth link, so a host cut off reaches nothing."""

    def __init__(self, port: int, target_port: int):
        self.server = socket.create_server((SERVICES_ADDRESS, port), reuse_port=False)
        self.port, self.target_port = self.server.getsockname()[1], target_port
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{self.port}").start()

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pipe(first: socket.socket, second: socket.socket):
        sockets = [first, second]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [], 60)
                for source in readable:
                    data = source.recv(65536)
                    if not data:
                        return
                    (second if source is first else first).sendall(data)
        except OSError:
            pass
        finally:
            first.close()
            second.close()

    def close(self):
        self._closed = True
        # Wake the thread blocked in accept() first: until it returns, the closed socket still listens, and the next
        # fleet (another module's, in another xdist process) could not bind the port.
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


# --- one host -------------------------------------------------------------------------------------------------

class SupervisedWorker:
    """`manage.py rqworker` in the host's namespace, started again a second after it exits (Restart=always),
    unless the drill holds it down."""

    def __init__(self, host: Host, queues: tuple[str, ...], env: dict, tag: str):
        self.host, self.queues, self.env, self.tag = host, queues, env, tag
        self.process: subprocess.Popen | None = None
        self.held_down = False
        self.starts = 0
        self._stopping = False
        self._log = open(host.folder / f"worker-{tag}.log", "a")  # noqa: SIM115 (every restart's log, kept open)
        self.pid_file = host.folder / f"worker-{tag}.pid"  # its main process now, as systemd's MainPID
        self._start()
        threading.Thread(target=self._supervise, daemon=True).start()

    def _start(self):
        self.starts += 1
        self._log.write(f"--- start {self.starts} at {time.time():.3f}\n")
        self._log.flush()
        self.process = subprocess.Popen(
            self.host.inside([sys.executable, "manage.py", "rqworker", *self.queues]), cwd=ROOT, env=self.env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid_file.write_text(f"{self.process.pid}\n")  # nsenter execs the worker: its pid is the worker's

    def _supervise(self):
        while not self._stopping:
            if self.process.poll() is not None and not self.held_down and not self._stopping:
                time.sleep(1)
                if not self.held_down and not self._stopping:
                    self._start()
            time.sleep(0.2)

    def kill(self):
        """SIGKILL the worker and its work horse, as a host's power going out would; held down until revive()."""
        self.held_down = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def revive(self):
        self.held_down = False

    def stop(self):
        self._stopping = True
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(40)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self._log.close()

    def output(self) -> str:
        self._log.flush()
        return (self.host.folder / f"worker-{self.tag}.log").read_text()


class Host:
    """One worker host: its namespace, its link to the root namespace, its engine, its workers."""

    def __init__(self, name: str, index: int, scratch: Path):
        self.name, self.index = name, index
        self.namespace = NAMESPACE_PREFIX + name
        self.link = LINK_PREFIX + name
        self.gateway_address, self.address = f"10.231.{index}.1", f"10.231.{index}.2"
        self.folder = scratch / name
        self.folder.mkdir(parents=True)
        self.job_root = self.folder / "jobs"
        self.local_root = self.folder / "folders"
        self.local_root.mkdir(mode=0o755)
        self.run_dir = RUN_DIR / name
        self.docker_host = f"unix://{self.run_dir}/docker.sock"
        self.data_root = ROOT / "var" / "fleet-docker" / name  # kept between runs: the images it imported
        self.engine_process: subprocess.Popen | None = None
        self.workers: list[SupervisedWorker] = []

    def inside(self, command: list[str]) -> list[str]:
        """The command run in this host's network namespace (nsenter, not `ip netns exec`: that remounts /sys,
        which hides the cgroup hierarchy from dockerd)."""
        return ["nsenter", f"--net=/run/netns/{self.namespace}", *command]

    def wire(self):
        ip("netns", "add", self.namespace)
        ip("link", "add", self.link, "type", "veth", "peer", "name", f"{self.link}-in")
        ip("link", "set", f"{self.link}-in", "netns", self.namespace)
        ip("addr", "add", f"{self.gateway_address}/30", "dev", self.link)
        ip("link", "set", self.link, "up")
        for command in (["link", "set", "lo", "up"], ["link", "set", f"{self.link}-in", "name", "eth0"],
                        ["addr", "add", f"{self.address}/30", "dev", "eth0"], ["link", "set", "eth0", "up"],
                        ["route", "add", "default", "via", self.gateway_address]):
            ip("-n", self.namespace, *command)

    def cut(self):
        """The host's link goes down: it reaches nothing, and nothing reaches it, until restore()."""
        ip("link", "set", self.link, "down")

    def restore(self):
        ip("link", "set", self.link, "up")

    def start_engine(self):
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "dockerd.log", "ab")  # noqa: SIM115 (dockerd writes it as long as it runs)
        self.engine_process = subprocess.Popen(self.inside([
            shutil.which("dockerd"), f"--storage-driver={services.storage_driver(self.data_root)}",
            "--iptables=false", "--bridge=none", "-H", self.docker_host, "--data-root", str(self.data_root),
            "--exec-root", str(self.run_dir / "exec"), "--pidfile", str(self.run_dir / "docker.pid")]),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        services.wait_until(lambda: services.docker_answers(self.docker_host) or self.engine_process.poll() is not None,
                            90, f"{self.name}'s dockerd", self.folder / "dockerd.log")
        if self.engine_process.poll() is not None:
            raise RuntimeError(f"{self.name}'s dockerd exited: see {self.folder / 'dockerd.log'}")
        services.ensure_demo_image(self.docker_host)

    def engine(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.docker_host, timeout=30)

    def containers(self) -> dict[str, object]:
        """This host's job containers, by job id, running or not."""
        found = self.engine().containers.list(all=True, filters={"label": "pidispatch.job"}, ignore_removed=True)
        return {container.labels["pidispatch.job"]: container for container in found}

    def start_worker(self, env: dict, *, queues: tuple[str, ...] | None = None, tag: str = "") -> SupervisedWorker:
        worker = SupervisedWorker(self, queues or ("pi-jobs", f"pi-jobs@{self.name}"), env,
                                  tag or str(len(self.workers)))
        self.workers.append(worker)
        return worker

    def restart_command(self) -> str:
        """A shell command that restarts this host's workers the way their unit does (`systemctl restart`,
        KillMode=mixed): SIGTERM to each worker's main process alone, never to its work horse, which finishes its
        job in the worker's warm shutdown; the supervisor starts it again once it has exited. Never a pattern over
        command lines: another test's worker (or this one's horse) can share those."""
        files = " ".join(str(worker.pid_file) for worker in self.workers)
        return f"for f in {files}; do kill -TERM \"$(cat \"$f\")\"; done"

    def kill_workers(self):
        for worker in self.workers:
            worker.kill()

    def revive_workers(self):
        for worker in self.workers:
            worker.revive()

    def stop_workers(self):
        for worker in self.workers:
            worker.stop()
        self.workers = []

    def stop_engine(self):
        if self.engine_process is None:
            return
        if self.engine_process.poll() is None:
            with contextlib.suppress(Exception):  # a dead engine has none to remove
                services.remove_job_containers(self.docker_host)
            os.killpg(self.engine_process.pid, signal.SIGTERM)
            try:
                self.engine_process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.engine_process.pid, signal.SIGKILL)
                self.engine_process.wait(30)
        self.engine_process = None


def unwire_everything():
    """Remove every namespace and link this module makes (this run's, or a killed run's)."""
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NAMESPACE_PREFIX):
            for pid in ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            ip("netns", "delete", name, check=False)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(LINK_PREFIX):
            ip("link", "delete", name, check=False)
    ip("addr", "del", f"{SERVICES_ADDRESS}/32", "dev", "lo", check=False)


# --- the fleet ------------------------------------------------------------------------------------------------

class Fleet:
    """Three hosts and the services they share; what drills start and stop."""

    def __init__(self, scratch: Path, database_url, *, sentinel: bool = False):
        self.scratch = scratch
        self.hosts = {name: Host(name, index, scratch) for index, name in enumerate(HOST_NAMES, start=1)}
        self.redis_service = None
        # `sentinel`: a primary, a replica and three sentinels (tests/sentinel_support.py) instead of one Redis, on
        # the services' address; every process of the fleet finds the primary through the sentinels.
        self.sentinel = sentinel
        self.sentinel_group = None
        self.redis_port = services.free_port()
        self.relays: list[Relay] = []
        self.processes: list[subprocess.Popen] = []
        self.forge = None
        self._database_url = database_url
        self._lock = None

    # the services' side

    def start(self):
        self._lock = open(LOCK, "w")  # noqa: SIM115 (the flock is held until the fleet stops)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # one fleet per machine: a second run waits here
        unwire_everything()
        ip("addr", "add", f"{SERVICES_ADDRESS}/32", "dev", "lo")  # the machine's loopback: reached by no one else
        for host in self.hosts.values():
            host.wire()
        self.start_redis()
        from django.db import connection

        port = int(connection.settings_dict.get("PORT") or 5432)
        self.relays.append(Relay(port, port))
        self.database = self._database_url(host=SERVICES_ADDRESS, port=port)
        self.forge = fake_forge.github_for_any_repository(self.scratch / "github", STAND_IN_TOKEN,
                                                          {"README.md": "A repository of the fleet drills.\n"},
                                                          address=SERVICES_ADDRESS)
        for host in self.hosts.values():
            host.start_engine()
        self.web_port = services.free_port()
        self.processes.append(self._root_process(
            [sys.executable, "-m", "gunicorn", "pidispatch_site.wsgi", "-b", f"127.0.0.1:{self.web_port}",
             "--workers", "2", "--timeout", "60"], "web"))
        self.processes.append(self._root_process(
            [sys.executable, "manage.py", "replay_deliveries", "--follow", "--interval", "1"], "replayer"))
        self.processes.append(self._root_process([sys.executable, "manage.py", "run_cron"], "cron"))
        services.wait_until(self._web_answers, 60, "gunicorn", self.scratch / "web.log")

    @property
    def redis_url(self) -> str:
        return f"redis://{SERVICES_ADDRESS}:{self.redis_port}/0"

    def start_redis(self):
        """The fleet's Redis: append-only (fsync every second), on loopback and the services' address."""
        if self.sentinel:
            from tests.sentinel_support import SentinelGroup

            self.sentinel_group = SentinelGroup(self.scratch / "redis", bind=SERVICES_ADDRESS).start()
            return
        self.redis_service = services.start_redis(self.scratch / "redis", self.redis_port, persistent=True,
                                                  bind=("127.0.0.1", SERVICES_ADDRESS), fsync="everysec")

    def stop_redis(self):
        (self.sentinel_group or self.redis_service).stop()

    def base_env(self) -> dict:
        return {**os.environ, "DATABASE_URL": self.database, "REDIS_URL": self.redis_url,
                "GITHUB_WEBHOOK_SECRET": GITHUB_SECRET, "GITHUB_SELF_ID": SELF_ID, "GITHUB_API_URL": self.forge.url,
                "GITHUB_TOKEN": STAND_IN_TOKEN, "PI_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": PROVIDER_KEY,
                "PI_JOB_MEMORY": "256m", "PI_HOST_CPU_BUDGET": "off", "PI_RETRY_BACKOFF_SECONDS": "1",
                "DATABASE_CONN_MAX_AGE": "0",
                "PI_REDIS_OUTAGE_SECONDS": "60", "PI_DAILY_CAP": "100000",
                # The drills count their own processes and rows: no worker's daily housekeeping beside them.
                "PI_HOUSEKEEPING_DAILY": "false", **FAST_FLEET,
                **(self.sentinel_group.env() if self.sentinel_group else {})}

    def host_env(self, host: Host, **extra) -> dict:
        env = {**self.base_env(), "PI_WORKER_NAME": host.name, "DOCKER_HOST": host.docker_host,
               "PI_JOB_ROOT": str(host.job_root), "PI_LOCAL_ROOTS": str(host.local_root),
               "PI_EGRESS_SOCKET_DIR": str(host.run_dir / "egress")}
        env.pop("PI_CONCURRENCY", None)
        env.update({name: str(value) for name, value in extra.items()})
        return env

    def _root_process(self, command: list[str], name: str) -> subprocess.Popen:
        log = open(self.scratch / f"{name}.log", "ab")  # noqa: SIM115 (the process writes it as long as it runs)
        return subprocess.Popen(command, cwd=ROOT, env=self.base_env() | {"REDIS_URL": self._loopback_redis()},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _loopback_redis(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def _web_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/healthz", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self):
        for host in self.hosts.values():
            host.stop_workers()
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        for host in self.hosts.values():
            host.stop_engine()
        if self.forge is not None:
            self.forge.close()
        for relay in self.relays:
            relay.close()
        for redis_service in (self.redis_service, self.sentinel_group):
            if redis_service is not None:
                redis_service.stop()
        unwire_everything()
        shutil.rmtree(RUN_DIR, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # what drills do

    @staticmethod
    def now():
        from django.utils import timezone

        return timezone.now()

    def fleet_command(self, *args: str) -> subprocess.CompletedProcess:
        """`manage.py fleet ...` as an operator runs it, in the root namespace."""
        return subprocess.run([sys.executable, "manage.py", "fleet", *args], cwd=ROOT,
                              env=self.base_env() | {"REDIS_URL": self._loopback_redis()}, capture_output=True,
                              text=True, timeout=60)

    def restart_redis(self, down_for: float, *, empty: bool = False):
        """Redis stopped (SIGTERM: its append-only file flushed) and started again on the same port: on the same
        files, or (`empty`) with none: a Redis that lost its data."""
        self.redis_service.stop()
        if empty:
            shutil.rmtree(self.scratch / "redis")
        time.sleep(down_for)
        self.start_redis()

    def deliver(self, repository: str, number: int, labels=("pi",), body: str = "") -> dict:
        """A signed GitHub `issues labeled` delivery to the web server, as GitHub sends it; its JSON answer."""
        payload = json.loads((ROOT / "tests" / "payloads" / "github" / "issues_labeled.json").read_text())
        owner, name = repository.split("/")
        payload["repository"].update(full_name=repository, name=name)
        payload["repository"]["owner"]["login"] = owner
        payload["issue"].update(number=number, body=body,
                                labels=[{"id": i, "name": label, "color": "ededed"} for i, label in enumerate(labels)])
        raw = json.dumps(payload).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.web_port}/hooks/github", data=raw, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  **github_headers(raw, "issues", str(uuid.uuid4()))})
        # 60 s: behind Sentinel a delivery that meets a failover waits up to 30 s for the new primary.
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read() or b"{}")


@contextlib.contextmanager
def running_fleet(django_db_blocker, scratch_name: str, **options):
    """A fleet started for a module of drills and stopped after it: its replayer and cron producer share the test
    database with the rest of the suite, and must not take another module's inbox (skipped, saying why, where it
    cannot run). Its logs stay in test-results/<scratch_name> for a look after the run."""
    from tests.conftest import database_url

    reason = why_not()
    if reason:
        pytest.skip(reason)
    with django_db_blocker.unblock():
        scratch = ROOT / "test-results" / scratch_name
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        started = Fleet(scratch, database_url, **options)
        atexit.register(started.stop)
        try:
            started.start()
            yield started
        finally:
            started.stop()
            atexit.unregister(started.stop)


@pytest.fixture(scope="module")
def fleet(django_db_setup, django_db_blocker):
    """The fleet of tests/hosts/test_fleet_drills.py: one Redis."""
    with running_fleet(django_db_blocker, "fleet") as started:
        yield started


@pytest.fixture(scope="module")
def sentinel_fleet(django_db_setup, django_db_blocker):
    """The fleet of tests/hosts/test_sentinel_drill.py: Redis behind three sentinels."""
    with running_fleet(django_db_blocker, "fleet-sentinel", sentinel=True) as started:
        yield started
