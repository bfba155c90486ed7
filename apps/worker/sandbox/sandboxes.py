"""The sandbox: a look inside a finished run, on the host that ran it (`python manage.py sandbox <job id>`).

When a forge job's container has ended, its worker keeps the job's folder (`<PI_JOB_ROOT>/<job id>/`: `job/` with
the prompt, `workspace/` with the clone as the agent left it) for PI_SANDBOX_RETENTION_HOURS, through the folder's
`KEEP_UNTIL` file (apps/worker/sandbox/jobfiles.py), and writes beside it `sandbox.json`: the image and the
limits the run had (ids, names and numbers only). The run's record says until when (`Run.sandbox_until`).

A sandbox is a NEW container (`pi-sandbox-<job id>-<hex>`) from the run's image on that folder, with the job's
isolation flags (apps/worker/sandbox/container.py's `isolation_options`: every capability dropped,
no-new-privileges, the job's non-root user, pids, memory and CPU limits, read-only root) and less: no network at
all (`none`, and no gateway socket mounted), no credentials (its environment is HOME, the job id and bash's idle
logout, nothing else), and an interactive shell that is logged out after PI_SANDBOX_IDLE_MINUTES without input.

While a sandbox runs, the folder is held twice over: the command holds a shared lock on the folder's holder file
(the sweeps only remove a folder they can lock exclusively), and the sweeps ask the engine for live sandbox
containers before removing anything (`in_use`), so a sandbox whose command was killed keeps its folder too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests
from django.conf import settings
from django.utils import timezone
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import LogConfig, Mount

from apps.worker.jobs import JOB_ID_PATTERN
from apps.worker.sandbox import container, jobfiles

logger = logging.getLogger("pidispatch.sandbox")

MANIFEST = "sandbox.json"
SANDBOX_PREFIX = "pi-sandbox-"
SANDBOX_LABEL = "pidispatch.sandbox"  # the job id whose folder it mounts
IDLE_CHECK_SECONDS = 5
ENGINE_ERRORS = (NotFound, APIError, requests.RequestException, DockerException)
# The shell: bash where the image has it (the production image), else the image's sh (the demo's busybox).
SHELL = 'if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi'


class SandboxUnavailable(Exception):
    """No sandbox for this job here; the message says why, and where one is when another host has it."""


@dataclass(frozen=True)
class Kept:
    job_id: str
    folder: Path
    until: datetime | None
    image: str
    user: tuple[int, int]
    memory: str
    cpus: float
    host: str
    ended_at: str

    @property
    def job(self) -> Path:
        return self.folder / "job"

    @property
    def workspace(self) -> Path:
        return self.folder / "workspace"


def retention() -> timedelta | None:
    hours = settings.PI_SANDBOX_RETENTION_HOURS
    return timedelta(hours=hours) if hours > 0 else None


def retain(dirs: jobfiles.JobDirs, *, job_id: str, image: str, user: tuple[int, int], memory: str, cpus: float,
           host: str, now: datetime) -> datetime | None:
    """Keep a finished run's folder for the sandbox: until when, or None (off, or a local job: its workspace is the
    operator's own folder, not the job's)."""
    keep_for = retention()
    if keep_for is None or dirs.workspace != dirs.root / "workspace":
        return None
    until = now + keep_for
    try:
        manifest = {"jobId": job_id, "image": image, "user": list(user), "memory": memory, "cpus": cpus,
                    "host": host, "endedAt": now.isoformat()}
        path = dirs.root / MANIFEST
        path.write_text(json.dumps(manifest))
        path.chmod(0o600)
        until = max(until, _keep_until(dirs.root) or until)
        _write_keep_until(dirs.root, until)
    except OSError as error:
        logger.warning("sandbox_not_kept job=%s error=%s", job_id, type(error).__name__)
        return None
    logger.info("sandbox_kept job=%s until=%s", job_id, until.isoformat())
    return until


def _keep_until(folder: Path) -> datetime | None:
    try:
        until = datetime.fromisoformat((folder / jobfiles.KEEP_UNTIL_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return until if until.tzinfo else until.replace(tzinfo=UTC)


def _write_keep_until(folder: Path, until: datetime) -> None:
    staged = folder / f"{jobfiles.KEEP_UNTIL_FILE}.new"
    staged.write_text(until.isoformat() + "\n")
    os.replace(staged, folder / jobfiles.KEEP_UNTIL_FILE)


# --- finding a kept run -----------------------------------------------------------------------------------------

def this_host() -> str:
    from apps.fleet.hosts import this_host as identity

    return identity().name


def find(job_id: str, now: datetime | None = None) -> Kept:
    """The kept folder of `job_id` on this host, or SandboxUnavailable saying why (and where it is instead)."""
    now = now or timezone.now()
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise SandboxUnavailable(f"{job_id!r} is not a job id")
    folder = Path(settings.PI_JOB_ROOT) / job_id
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        raise SandboxUnavailable(_elsewhere(job_id, now)) from None
    until = _keep_until(folder)
    if until is not None and until <= now:
        raise SandboxUnavailable(f"the sandbox of {job_id} expired at {until:%Y-%m-%d %H:%M} UTC "
                                 f"(PI_SANDBOX_RETENTION_HOURS={settings.PI_SANDBOX_RETENTION_HOURS}); "
                                 "its folder goes with the next sweep")
    try:
        user = (int(manifest["user"][0]), int(manifest["user"][1]))
        return Kept(job_id=job_id, folder=folder, until=until, image=str(manifest["image"]), user=user,
                    memory=str(manifest["memory"]), cpus=float(manifest["cpus"]), host=str(manifest.get("host", "")),
                    ended_at=str(manifest.get("endedAt", "")))
    except (KeyError, IndexError, TypeError, ValueError):
        raise SandboxUnavailable(f"the sandbox record of {job_id} ({folder / MANIFEST}) is unreadable") from None


def _elsewhere(job_id: str, now: datetime) -> str:
    from apps.worker.models import Run

    run = Run.objects.filter(job_id=job_id).order_by("-attempt").first()
    if run is None:
        return f"no run has the job id {job_id}"
    here = this_host()
    if run.sandbox_until is None:
        return (f"{job_id} (attempt {run.attempt}, {run.outcome}) kept no sandbox: none is kept when no container "
                "ran, for a local folder's run, or with PI_SANDBOX_RETENTION_HOURS=0 on its host")
    if run.sandbox_until <= now:
        return f"the sandbox of {job_id} on host {run.host} expired at {run.sandbox_until:%Y-%m-%d %H:%M} UTC"
    if run.host and run.host != here:
        return (f"{job_id} ran on host {run.host}, not on this one ({here}): its sandbox is there until "
                f"{run.sandbox_until:%Y-%m-%d %H:%M} UTC. On {run.host}: python manage.py sandbox {job_id}")
    return f"the folder of {job_id} is no longer on this host ({here}): removed before its time, or another PI_JOB_ROOT"


# --- the sandbox container --------------------------------------------------------------------------------------

class _Held:
    """A shared lock on the folder's holder file while the sandbox runs: the sweeps lock exclusively to remove."""

    def __init__(self, kept: Kept):
        path = kept.folder / jobfiles.HOLDER_FILE
        try:
            self.descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise SandboxUnavailable(f"the folder of {kept.job_id} has no holder file: not a kept run") from None
        try:
            fcntl.flock(self.descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            os.close(self.descriptor)
            raise SandboxUnavailable(f"{kept.job_id} is running again on this host: wait for it to end") from None

    def release(self) -> None:
        os.close(self.descriptor)


def create_options(kept: Kept, *, command: str | None) -> dict:
    """The sandbox container: the job's isolation flags on its folder, no network, no gateway, no credentials."""
    environment = {"HOME": container.JOB_HOME, "PI_JOB_ID": kept.job_id, "PI_SANDBOX": "1",
                   "TMOUT": str(max(1, settings.PI_SANDBOX_IDLE_MINUTES) * 60)}
    interactive = command is None
    return dict(
        image=kept.image,
        name=f"{SANDBOX_PREFIX}{kept.job_id}-{secrets.token_hex(3)}",
        labels={SANDBOX_LABEL: kept.job_id, container.HOST_LABEL: kept.host or this_host()},
        entrypoint=["/bin/sh", "-c"],
        command=[SHELL if interactive else command],
        working_dir="/workspace",
        environment=environment,
        mounts=[Mount("/job", str(kept.job), type="bind", read_only=True),
                Mount("/workspace", str(kept.workspace), type="bind", read_only=False)],
        tty=interactive,
        stdin_open=interactive,
        # Attached (not detached) makes the engine close the shell's input when its terminal's session ends: a
        # killed command's shell ends too (docker-py's StdinOnce).
        detach=not interactive,
        # What --command prints is read back from the engine: its own log, whatever the engine's default driver.
        log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        **container.isolation_options(kept.user, memory=kept.memory, cpus=kept.cpus),
    )


@dataclass(frozen=True)
class Finished:
    exit_code: int
    output: bytes


def open_sandbox(job_id: str, *, command: str | None = None, on_created=None) -> Finished:
    """Start a sandbox on the kept run `job_id`: `command` runs in it and its output comes back; without one,
    an interactive shell on this terminal (the docker CLI attaches it). The container goes when it ends."""
    kept = find(job_id)
    held = _Held(kept)
    try:
        client = container.engine()
        try:
            client.images.get(kept.image)
        except ImageNotFound:
            raise SandboxUnavailable(f"the run's image {kept.image} is no longer on this host's engine") from None
        try:
            created = client.containers.create(**create_options(kept, command=command))
        except (APIError, requests.RequestException, DockerException) as error:
            raise SandboxUnavailable(f"the engine refused the sandbox: {type(error).__name__}") from None
        logger.info("sandbox_started job=%s container=%s interactive=%s", job_id, created.name, command is None)
        try:
            if on_created is not None:
                on_created(created)
            if command is None:
                return Finished(_attach(created), b"")
            created.start()
            code = created.wait().get("StatusCode", 1)
            return Finished(code, created.logs(stdout=True, stderr=True))
        finally:
            with contextlib.suppress(*ENGINE_ERRORS):
                created.remove(force=True)
            logger.info("sandbox_ended job=%s container=%s", job_id, created.name)
    except container.EngineUnavailable as error:
        raise SandboxUnavailable(f"the Docker engine does not answer ({error})") from None
    finally:
        held.release()


def _attach(created) -> int:
    """The shell on this terminal, through the docker CLI. The idle logout is the host's: the kernel stamps a
    terminal's access time when a program reads input from it (as `w` shows a session's idle time), so past
    PI_SANDBOX_IDLE_MINUTES with no keystroke read the container is stopped, whatever shell the image has (busybox's
    ignores TMOUT), and the CLI returns."""
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        raise SandboxUnavailable("an interactive sandbox needs the docker CLI on this host (or use --command)")
    terminal = os.ttyname(0) if os.isatty(0) else None
    limit = max(1, settings.PI_SANDBOX_IDLE_MINUTES) * 60
    session = subprocess.Popen([docker_cli, "start", "--attach", "--interactive", created.id])
    started = time.time()
    while True:
        try:
            return session.wait(timeout=IDLE_CHECK_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        if terminal is None:
            continue
        try:
            last_input = max(os.stat(terminal).st_atime, started)
        except OSError:
            continue
        if time.time() - last_input > limit:
            logger.info("sandbox_idle_logout container=%s minutes=%d", created.name, limit // 60)
            sys.stderr.write(f"\r\nno input for {limit // 60} minute(s): the sandbox is logged out\r\n")
            with contextlib.suppress(*ENGINE_ERRORS):
                created.stop(timeout=2)
            try:
                return session.wait(timeout=30)
            except subprocess.TimeoutExpired:
                session.kill()
                return session.wait()


# --- listing, pinning, and what the sweeps keep ------------------------------------------------------------------

def kept_runs(now: datetime | None = None) -> list[tuple[Kept | None, str, int]]:
    """Every kept run folder of this host: (kept, job id, live sandboxes on it); kept None when unreadable."""
    now = now or timezone.now()
    root = Path(settings.PI_JOB_ROOT)
    live = live_sandboxes() or {}
    found = []
    for manifest in sorted(root.glob(f"*/{MANIFEST}")):
        job_id = manifest.parent.name
        try:
            found.append((find(job_id, now), job_id, live.get(job_id, 0)))
        except SandboxUnavailable:
            found.append((None, job_id, live.get(job_id, 0)))
    return found


def pin(job_id: str, now: datetime | None = None) -> datetime:
    """Keep a run's folder PI_SANDBOX_PIN_DAYS longer (from its current end, or from now when that is past)."""
    from apps.worker.records import record_sandbox_until

    now = now or timezone.now()
    kept = find(job_id, now)
    until = max(kept.until or now, now) + timedelta(days=settings.PI_SANDBOX_PIN_DAYS)
    _write_keep_until(kept.folder, until)
    record_sandbox_until(job_id, until)
    logger.info("sandbox_pinned job=%s until=%s", job_id, until.isoformat())
    return until


def live_sandboxes() -> dict[str, int] | None:
    """Job id -> live sandbox containers on this host's engine; None when the engine does not answer."""
    try:
        # Running ones: a sandbox being created is held by its command's lock on the folder.
        found = container.engine().containers.list(filters={"label": [SANDBOX_LABEL]}, ignore_removed=True)
    except (container.EngineUnavailable, DockerException, requests.RequestException):
        return None
    live: dict[str, int] = {}
    for each in found:
        job_id = each.labels.get(SANDBOX_LABEL, "")
        live[job_id] = live.get(job_id, 0) + 1
    return live


def remove_ended() -> int:
    """Sandbox containers that ended without their command (it was killed before it could remove them)."""
    removed = 0
    try:
        ended = container.engine().containers.list(
            all=True, filters={"label": [SANDBOX_LABEL], "status": ["exited", "dead"]}, ignore_removed=True)
        for each in ended:
            each.remove(force=True)
            removed += 1
    except (container.EngineUnavailable, NotFound, APIError, DockerException, requests.RequestException):
        pass
    return removed


def in_use(folder: Path) -> bool:
    """For the sweeps: keep a folder a live sandbox mounts (any doubt keeps a folder that has a sandbox)."""
    if not (folder / MANIFEST).exists():
        return False
    live = live_sandboxes()
    return live is None or folder.name in live
