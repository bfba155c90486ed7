"""Bring up what pidispatch needs on a developer or CI machine: Redis, a Docker engine, the demo image.

Used by `make run` (devtools.stack run) and `make test` (devtools.stack test), so both reach their
services the same way. No Django import here: settings read the URLs this module hands out.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from apps.worker.sandbox import image_contract

ROOT = Path(__file__).resolve().parent.parent
DEMO_IMAGE = "pidispatch-demo:latest"
DEMO_RUNNER = ROOT / "image" / "demo" / "pi-runner"
DEMO_DIGEST_LABEL = "pidispatch.demo.digest"
JOB_UID = 1000


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


class SetupError(SystemExit):
    """A setup step that cannot continue; the message says what to do next."""

    def __init__(self, message: str):
        super().__init__(f"\nsetup failed: {message}")


# --- system packages -------------------------------------------------------------------------------

_apt_updated = False
SBIN_PATHS = (Path("/usr/sbin"), Path("/usr/bin"), Path("/sbin"), Path("/bin"))


def install_package(package: str) -> None:
    global _apt_updated
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SetupError(f"the Debian package `{package}` is needed. Install it (as root: "
                         f"apt-get install -y {package}) and run this again.")
    say(f"installing {package} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        _apt_updated = True
    result = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], env=env)
    if result.returncode != 0:
        raise SetupError(f"apt-get could not install {package}; check the package sources and run this again.")


def find_binary(binary: str) -> str | None:
    return shutil.which(binary) or next((str(d / binary) for d in SBIN_PATHS if (d / binary).exists()), None)


def ensure_package(binary: str, package: str) -> str:
    """The path of `binary`, installing the Debian package that provides it when it is missing."""
    path = find_binary(binary)
    if not path:
        install_package(package)
        path = find_binary(binary)
    if not path:
        raise SetupError(f"{package} is installed but `{binary}` is still missing.")
    return path


def free_port(preferred: int | None = None) -> int:
    if preferred and port_is_free(preferred):
        return preferred
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_until(check, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    hint = f" See {log}." if log else ""
    raise SetupError(f"{what} did not come up within {timeout:.0f} s.{hint}")


# --- processes we own --------------------------------------------------------------------------------

@dataclass
class Service:
    """A background process (or in-process server) this run started, and therefore stops."""

    name: str
    process: subprocess.Popen | None = None
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 20.0
    env: dict[str, str] = field(default_factory=dict)
    stop_function: object = None  # for a server running inside this process
    runtime_dir: Path | None = None  # its sockets and state under /run: removed once it has stopped

    def stop(self) -> None:
        try:
            self._stop()
        finally:
            if self.runtime_dir is not None and (self.process is None or self.process.poll() is not None):
                # Never into a mount a dead engine left behind (its exec root): that stays for the next start.
                subprocess.run(["rm", "-rf", "--one-file-system", str(self.runtime_dir)], check=False,
                               stderr=subprocess.DEVNULL)

    def _stop(self) -> None:
        if self.stop_function is not None:
            self.stop_function()
            return
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, self.stop_signal)
        except ProcessLookupError:
            return
        try:
            self.process.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        _wait_for_group(self.process.pid)


def _wait_for_group(group: int, seconds: float = 5.0) -> None:
    """The leader is gone; its group's other members (dockerd's helpers, a worker's horse) may outlive it by
    a moment. Wait for them, then kill what is left: a stopped service leaves no process behind."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def stop_stray_children(seconds: float = 5.0) -> list[int]:
    """Stop what this process forked and no Service holds: a stop signal that lands between a spawn's fork
    and Popen's return leaves a child running (a `manage.py migrate`, say) that nothing knows to stop. Each
    is stopped with its group (every spawn makes its own session), as a Service would be. Returns their pids."""
    strays = _children()
    for pid in strays:
        _signal_child(pid, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    for pid in strays:
        while not _reaped(pid):
            if time.monotonic() >= deadline:
                _signal_child(pid, signal.SIGKILL)
                _reaped(pid, block=True)
                break
            time.sleep(0.05)
        _wait_for_group(pid, max(0.0, deadline - time.monotonic()))  # what it started, within the same bound
    return strays


def _children() -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if fields[1] == me:  # the parent's pid, after the state
                found.append(int(entry.name))
    return found


def _signal_child(pid: int, number: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, number)
        else:
            os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def _reaped(pid: int, block: bool = False) -> bool:
    try:
        done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return True  # reaped already (by a Popen's own bookkeeping)
    return done == pid


def spawn(command: list[str], log: Path | None = None, env: dict | None = None) -> subprocess.Popen:
    """Start a process in its own session, so a terminal's Ctrl-C reaches only us and we stop it in order."""
    out = open(log, "ab") if log else None  # noqa: SIM115 (the child writes it after we return)
    return subprocess.Popen(
        command, stdout=out or None, stderr=subprocess.STDOUT if out else None,
        env=env, start_new_session=True, cwd=ROOT,
    )


# --- Redis -------------------------------------------------------------------------------------------

def sentinel_primary(sentinels: str, master: str) -> str:
    """The primary the sentinels name for `master` as `make run` reports it; a SetupError saying what is wrong."""
    import redis
    from redis.sentinel import Sentinel

    from apps.fleet.connection import sentinel_addresses

    try:
        addresses = sentinel_addresses(sentinels)
        if not master:
            raise ValueError("REDIS_SENTINELS is set but REDIS_SENTINEL_MASTER is not")
        host, port = Sentinel(list(addresses), socket_timeout=1).discover_master(master)
    except ValueError as error:
        raise SetupError(str(error)) from None
    except redis.RedisError as error:
        raise SetupError(f"the sentinels {sentinels} name no primary for {master!r} ({type(error).__name__}): "
                         "start them, or unset REDIS_SENTINELS to use REDIS_URL") from None
    return f"the Redis primary {host}:{port} that the sentinels name for {master!r}"


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping())
    except (redis.RedisError, OSError, ValueError):
        return False


def _aof_written(persistence: dict) -> bool:
    return (persistence.get("aof_enabled") == 1 and persistence.get("aof_rewrite_in_progress") == 0
            and persistence.get("aof_rewrite_scheduled") == 0)


def start_redis(data_dir: Path, port: int, persistent: bool, started=None, bind: tuple[str, ...] = ("127.0.0.1",),
                fsync: str = "always") -> Service:
    """A private redis-server. `persistent`: every write is on disk in its append-only file before Redis
    answers it, so neither a killed Redis nor a power cut loses the jobs whose deliveries the inbox has
    already settled (a snapshot every minute would lose up to a minute of them). `started(service)` is called
    as soon as the process exists, so that a stop while it comes up still stops it."""
    binary = ensure_package("redis-server", "redis-server")
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "redis.log"
    command = [binary, "--port", str(port), "--bind", *bind, "--dir", str(data_dir),
               "--daemonize", "no", "--logfile", str(log), "--save", "",
               # Bound to loopback alone, protected mode is its guard; bound to an address of our own making too
               # (the fleet drills' services address), the binding is, and remote clients must be let in.
               "--protected-mode", "yes" if bind == ("127.0.0.1",) else "no"]
    # A folder from before the append-only file holds only a snapshot, which Redis ignores when it starts
    # with appendonly on: load the snapshot first, then switch (Redis writes the file from memory).
    has_log = (data_dir / "appendonlydir").is_dir()
    logged = ["--appendonly", "yes", "--appendfsync", fsync]
    command += logged if persistent and has_log else ["--appendonly", "no"]
    url = f"redis://127.0.0.1:{port}/0"
    service = Service("redis", spawn(command), env={"REDIS_URL": url})
    if started:
        started(service)
    wait_until(lambda: redis_answers(url), 20, "redis-server", log)
    if persistent and not has_log:
        import redis

        client = redis.Redis.from_url(url)
        client.config_set("appendfsync", fsync)
        client.config_set("appendonly", "yes")
        wait_until(lambda: _aof_written(client.info("persistence")), 60, "redis-server's append-only file", log)
    return service


# --- PostgreSQL --------------------------------------------------------------------------------------

def postgres_binaries() -> Path:
    """The newest installed PostgreSQL's bin folder (Debian keeps them off PATH), installing it when none is."""
    def newest() -> Path | None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
        return found[-1].parent if found else None

    if newest() is None:
        install_package("postgresql")
    if newest() is None:
        raise SetupError("postgresql is installed but no initdb is under /usr/lib/postgresql.")
    return newest()


def start_postgres(data_dir: Path, port: int, started=None) -> Service:
    """A private PostgreSQL on 127.0.0.1:`port`, its cluster in `data_dir` (made here, as the `postgres` user,
    trusting local connections, without fsync: a test database, thrown away with its folder)."""
    binaries = postgres_binaries()
    data_dir.mkdir(parents=True)
    shutil.chown(data_dir, "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    initdb = subprocess.run([*as_postgres, str(binaries / "initdb"), "-D", str(data_dir / "data"), "-A", "trust",
                             "-U", "postgres"], capture_output=True, text=True)
    if initdb.returncode != 0:
        raise SetupError(f"initdb failed: {initdb.stderr.strip()[-500:]}")
    log = data_dir / "postgres.log"
    log.touch()
    shutil.chown(log, "postgres")
    command = [*as_postgres, str(binaries / "postgres"), "-D", str(data_dir / "data"), "-p", str(port),
               "-k", str(data_dir), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
               "-c", "full_page_writes=off", "-c", "max_connections=200"]
    url = f"postgres://postgres@127.0.0.1:{port}/pidispatch"
    # SIGINT: PostgreSQL's fast shutdown (its sessions are ended, not waited for).
    service = Service("postgresql", spawn(command, log=log), stop_signal=signal.SIGINT, env={"DATABASE_URL": url})
    if started:
        started(service)
    wait_until(lambda: _postgres_answers(port) or service.process.poll() is not None, 60, "postgres", log)
    if service.process.poll() is not None:
        raise SetupError(f"postgres exited with code {service.process.returncode}. See {log}.")
    return service


def _postgres_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
    except OSError:
        return False
    ready = subprocess.run(["runuser", "-u", "postgres", "--", str(postgres_binaries() / "pg_isready"), "-h",
                            "127.0.0.1", "-p", str(port)], capture_output=True)
    return ready.returncode == 0


# --- Docker ------------------------------------------------------------------------------------------

def docker_answers(docker_host: str | None) -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=docker_host, timeout=3) if docker_host else docker.from_env(timeout=3)
        return bool(client.ping())
    except Exception:  # any failure to connect means "no engine here"
        return False


def _short_run_dir(data_root: Path) -> Path:
    """Unix socket paths are limited to 108 bytes, so engine sockets live under a short /run path."""
    digest = hashlib.sha256(str(data_root).encode()).hexdigest()[:10]
    base = Path("/run") if os.access("/run", os.W_OK) else Path("/tmp")
    return base / f"pidispatch-{digest}"


def storage_driver(data_root: Path) -> str:
    """overlay2 where the data root's filesystem carries it (ext4/xfs with d_type, not overlayfs itself), else
    vfs. vfs copies the whole image for every container: `docker create` of the 512 MB job image takes
    6-23 s on it, against 0.01-0.5 s on overlay2."""
    if os.environ.get("PI_DOCKER_STORAGE_DRIVER"):
        return os.environ["PI_DOCKER_STORAGE_DRIVER"]
    probe = Path(tempfile.mkdtemp(prefix=".overlay-probe-", dir=data_root))
    try:
        for name in ("lower", "upper", "work", "merged"):
            (probe / name).mkdir()
        (probe / "lower" / "file").write_text("x")
        mounted = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={probe / 'lower'},upperdir={probe / 'upper'},workdir={probe / 'work'}", str(probe / "merged")],
            capture_output=True).returncode == 0
        return "overlay2" if mounted and (probe / "merged" / "file").exists() else "vfs"
    finally:
        # Here, not after the check: a stop signal in between must not leave the probe mounted.
        if os.path.ismount(probe / "merged"):
            subprocess.run(["umount", str(probe / "merged")], capture_output=True)
        shutil.rmtree(probe, ignore_errors=True)


def start_dockerd(data_root: Path, started=None) -> tuple[str, Service | None]:
    """A private engine for this checkout (overlay2 or vfs storage, no bridge, no iptables). Reused if already
    running. `started(service)` is called as soon as the process exists (see start_redis)."""
    binary = ensure_package("dockerd", "docker.io")
    if os.geteuid() != 0:
        raise SetupError("starting a private Docker engine needs root; run as root, or point DOCKER_HOST at a "
                         "running engine and run this again.")
    run_dir = _short_run_dir(data_root)
    run_dir.mkdir(parents=True, exist_ok=True)
    data_root.mkdir(parents=True, exist_ok=True)
    docker_host = f"unix://{run_dir}/docker.sock"
    if docker_answers(docker_host):
        return docker_host, None
    for stale in (run_dir / "docker.sock", run_dir / "docker.pid"):
        stale.unlink(missing_ok=True)
    log = data_root / "dockerd.log"
    driver = storage_driver(data_root)
    say(f"the engine stores images with {driver}" + ("" if driver == "overlay2" else
        " (this filesystem cannot carry overlay2: each job container copies its whole image, seconds per job)"))
    command = [binary, f"--storage-driver={driver}", "--iptables=false", "--bridge=none",
               "-H", docker_host, "--data-root", str(data_root), "--exec-root", str(run_dir / "exec"),
               "--pidfile", str(run_dir / "docker.pid")]
    process = spawn(command, log=log)
    service = Service("dockerd", process, stop_timeout=30, env={"DOCKER_HOST": docker_host}, runtime_dir=run_dir)
    if started:
        started(service)
    wait_until(lambda: docker_answers(docker_host) or process.poll() is not None, 90, "dockerd", log)
    if process.poll() is not None:
        raise SetupError(f"dockerd exited with code {process.returncode}. See {log}.")
    return docker_host, service


def remove_job_containers(docker_host: str) -> int:
    """Remove every pidispatch job container on this engine (used when the whole stack stops)."""
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=30)
    containers = client.containers.list(all=True, filters={"label": "pidispatch.job"}, ignore_removed=True)
    for container in containers:
        container.remove(force=True)
    return len(containers)


# --- the demo/test job image -----------------------------------------------------------------------

def _is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a program interpreter (so it runs in an empty image)."""
    data = path.read_bytes()[:65536]
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only
        return False
    little = data[5] == 1
    order = "little" if little else "big"
    phoff = int.from_bytes(data[32:40], order)
    phentsize = int.from_bytes(data[54:56], order)
    phnum = int.from_bytes(data[56:58], order)
    for i in range(phnum):
        entry = data[phoff + i * phentsize: phoff + (i + 1) * phentsize]
        if int.from_bytes(entry[:4], order) == 3:  # PT_INTERP
            return False
    return True


BUSYBOX_PATHS = (Path("/bin/busybox"), Path("/usr/bin/busybox"))


def static_busybox() -> Path:
    """Debian's busybox-static binary (a dynamically linked busybox cannot run in an empty image)."""
    for attempt in range(2):
        for candidate in BUSYBOX_PATHS:
            if candidate.exists() and _is_static_elf(candidate):
                return candidate
        if attempt == 0:
            install_package("busybox-static")
    raise SetupError("busybox-static is installed but no static /bin/busybox was found.")


def build_rootfs(busybox: Path) -> bytes:
    """A tar of the image's root: busybox and its applets, a non-root `pi` user, and the fake runner."""
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def add_dir(name, mode=0o755, uid=0):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, uid
            tar.addfile(info)

        def add_file(name, data: bytes, mode=0o644):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        for directory in ("bin", "etc", "usr", "usr/local", "usr/local/bin", "job", "workspace", "home", "proc",
                          "sys", "dev"):
            add_dir(directory)
        add_dir("tmp", 0o1777)
        add_dir("home/pi", 0o755, JOB_UID)
        add_file("bin/busybox", busybox.read_bytes(), 0o755)
        for applet in applets:
            if applet != "busybox":
                info = tarfile.TarInfo(f"bin/{applet}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(info)
        add_file("etc/passwd",
                 f"root:x:0:0:root:/root:/bin/sh\npi:x:{JOB_UID}:{JOB_UID}:pi:/home/pi:/bin/sh\n".encode())
        add_file("etc/group", f"root:x:0:\npi:x:{JOB_UID}:\n".encode())
        add_file("usr/local/bin/pi-runner", DEMO_RUNNER.read_bytes(), 0o755)
    return buffer.getvalue()


def demo_image_digest(busybox: Path) -> str:
    digest = hashlib.sha256(DEMO_RUNNER.read_bytes())
    digest.update(image_contract.RUNNER_PROTOCOL.encode())
    digest.update(hashlib.sha256(busybox.read_bytes()).digest())
    return digest.hexdigest()[:16]


def ensure_demo_image(docker_host: str, image: str = DEMO_IMAGE) -> str:
    """Build (docker import) the demo image when it is missing or its runner changed."""
    import docker

    client = docker.DockerClient(base_url=docker_host, timeout=120)
    busybox = static_busybox()
    digest = demo_image_digest(busybox)
    try:
        if client.images.get(image).labels.get(DEMO_DIGEST_LABEL) == digest:
            return image
    except docker.errors.ImageNotFound:
        pass
    say(f"building the demo job image {image} (docker import: busybox-static + fake pi runner)")
    repository, _, tag = image.partition(":")
    client.api.import_image_from_data(
        build_rootfs(busybox), repository=repository, tag=tag or "latest",
        changes=[
            f"USER {JOB_UID}:{JOB_UID}",
            "WORKDIR /workspace",
            "ENV PATH=/bin:/usr/local/bin HOME=/home/pi",
            'ENTRYPOINT ["/usr/local/bin/pi-runner"]',
            f"LABEL {DEMO_DIGEST_LABEL}={digest}",
            # It speaks the runner protocol (the exit line); it holds no pi.
            f"LABEL {image_contract.PROTOCOL_LABEL}={image_contract.RUNNER_PROTOCOL} "
            f"{image_contract.PI_VERSION_LABEL}=none-demo",
        ],
    )
    if client.images.get(image).labels.get(DEMO_DIGEST_LABEL) != digest:
        raise SetupError(f"docker import did not produce {image}; see the engine log.")
    return image
