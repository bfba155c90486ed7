"""The container runner (DESIGN section 7), through the Docker SDK.

One single-use container per job, named `pi-job-<job id>` and labelled for the boot reaper. The
isolation flags are fixed here and are never taken from a trigger. Nothing is ever pulled.

What the job may write: `/workspace` (a bind mount, measured by apps/worker/sandbox/disk.py), and `/tmp` and its
home, tmpfs bounded by PI_JOB_TMP_MB and PI_JOB_HOME_MB (memory, inside the container's memory limit). The root
filesystem is read-only, so nothing else the job writes lands in the engine's data root on the host's disk.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import requests
from django.conf import settings
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import LogConfig, Mount

from apps.worker.sandbox import image_contract

logger = logging.getLogger("pidispatch.container")

JOB_LABEL = "pidispatch.job"
HOST_LABEL = "pidispatch.host"
# The unix time its worker stops the container at: past it (and the stop's own time) any worker's reaper on
# the host stops it, whoever started it (apps/worker/process/worker_lost.py, reap_overdue).
DEADLINE_LABEL = "pidispatch.deadline"
CONTAINER_PREFIX = "pi-job-"
JOB_HOME = "/home/pi"  # the job user's HOME in every image (DESIGN section 7)
SESSION_MOUNT = "/session"  # a `run.resume` job's session folder (the runner looks for it)
STOP_GRACE_SECONDS = 5
# The summary and exit lines are read from the end of stdout; anything before this many bytes is ignored.
OUTPUT_TAIL_BYTES = 64 * 1024
WAIT_SLICE_SECONDS = 2.0


class EngineUnavailable(Exception):
    """The Docker engine did not answer: an infrastructure fault, retried."""


class ImageMissing(Exception):
    """The engine answered and the image is not there: a policy refusal (`job-image-missing`)."""


class NeverStarted(Exception):
    """The container could not be created or started: an infrastructure fault, retried."""


@dataclass(frozen=True)
class ContainerExit:
    exit_code: int | None
    output_tail: bytes
    timed_out: bool = False
    oom_killed: bool = False
    started_at: float = 0.0
    ended_at: float = 0.0
    # The whole output (stdout and stderr, as the engine kept it: its json-file log's last 1 MB) when run logs
    # are captured (log_bytes > 0; run_logs.py scrubs, then cuts it), else None.
    log: bytes | None = None


def engine() -> docker.DockerClient:
    """A client for DOCKER_HOST (or the default socket). Made per job: clients do not survive a fork.

    The engine's API version is asked once per process and remembered, so the worker's parent (which
    asks at boot) hands it to every forked work horse and a job spends no round trip on it.
    """
    global _api_version
    try:
        client = docker.from_env(timeout=30, version=_api_version or "auto")
    except DockerException as exc:
        raise EngineUnavailable(type(exc).__name__) from None
    _api_version = client.api.api_version
    return client


_api_version: str | None = None


def container_name(job_id: str) -> str:
    return f"{CONTAINER_PREFIX}{job_id}"


def job_user() -> tuple[int, int]:
    """The uid:gid a forge job runs as: the worker's own ids when it is not root, else PI_JOB_USER (never 0)."""
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    uid, _, gid = settings.PI_JOB_USER.partition(":")
    user = (int(uid), int(gid or uid))
    if user[0] == 0:
        raise ValueError("PI_JOB_USER must not be root (uid 0)")
    return user


def memory_bytes(size: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    size = size.strip().lower().rstrip("b")
    if size and size[-1] in units:
        return int(float(size[:-1]) * units[size[-1]])
    return int(size)


class ImageIncompatible(Exception):
    """The image is there but was not built for this worker's runner protocol: refused with `reason`."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def preflight_image(client: docker.DockerClient, image: str) -> str:
    """The image id, or ImageMissing / ImageIncompatible / EngineUnavailable. Never cached: an operator may
    rebuild mid-day. The image's labels say which runner protocol it speaks (apps/worker/sandbox/image_contract.py)."""
    try:
        found = client.images.get(image)
    except ImageNotFound:
        raise ImageMissing(image) from None
    except (APIError, requests.RequestException, DockerException) as exc:
        raise EngineUnavailable(type(exc).__name__) from None
    reason = image_contract.incompatibility(found.labels)
    if reason:
        raise ImageIncompatible(reason)
    return found.id


def stop_job_container(job_id: str) -> None:
    """Stop a job's container now (SIGTERM, SIGKILL after the grace), from any thread of the worker."""
    try:
        engine().containers.get(container_name(job_id)).stop(timeout=STOP_GRACE_SECONDS)
    except NotFound:
        pass
    except (EngineUnavailable, APIError, requests.RequestException, DockerException):
        logger.warning("container_stop_failed container=%s", container_name(job_id))


def run_container(
    client: docker.DockerClient,
    *,
    job_id: str,
    host: str,
    image: str,
    job_dir: Path,
    workspace: Path,
    environment: dict[str, str],
    timeout_seconds: float,
    user: tuple[int, int],
    memory: str,
    cpus: float,
    labels: dict[str, str] | None = None,
    egress_mounts: list[tuple[str, str]] = (),
    overlay_mounts: list[tuple[str, str]] = (),
    log_bytes: int = 0,
    session_folder: Path | None = None,
    outbox: Path | None = None,
) -> ContainerExit:
    deadline = time.time() + timeout_seconds
    try:
        container = _create_once_named(
            client, job_id,
            image=image,
            name=container_name(job_id),
            labels={**(labels or {}), JOB_LABEL: job_id, HOST_LABEL: host, DEADLINE_LABEL: str(int(deadline))},
            **isolation_options(user, memory=memory, cpus=cpus),
            environment=environment,
            mounts=[
                Mount("/job", str(job_dir), type="bind", read_only=True),
                Mount("/workspace", str(workspace), type="bind", read_only=False),
                # Chaining on: where the agent asks for follow-up jobs (apps/worker/chaining/).
                *([Mount("/outbox", str(outbox), type="bind", read_only=False)] if outbox is not None else []),
                # The gateway's sockets: the container's only way out (network_mode none).
                *(Mount(target, source, type="bind", read_only=True) for source, target in egress_mounts),
                # The operator's pi overlay (apps/worker/sandbox/pi_overlay.py): read-only, the same for every job.
                *(Mount(target, source, type="bind", read_only=True) for source, target in overlay_mounts),
                # A `run.resume` job's session folder (apps/worker/sessions/): pi reads and appends its transcript.
                *([Mount(SESSION_MOUNT, str(session_folder), type="bind", read_only=False)] if session_folder else []),
            ],
            log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            detach=True,
        )
    except ImageNotFound:
        raise ImageMissing(image) from None
    except (APIError, requests.RequestException, DockerException) as exc:
        raise NeverStarted(type(exc).__name__) from None

    try:
        try:
            container.start()
        except (APIError, requests.RequestException, DockerException) as exc:
            raise NeverStarted(type(exc).__name__) from None
        started = time.time()
        exit_code, timed_out = _wait(container, deadline=deadline)
        ended = time.time()
        log = container.logs(stdout=True, stderr=True) if log_bytes > 0 else None
        return ContainerExit(
            exit_code=exit_code,
            output_tail=_stdout_tail(container),
            timed_out=timed_out,
            oom_killed=exit_code == 137 and _oom_killed(container),
            started_at=started,
            ended_at=ended,
            log=log,
        )
    except (requests.RequestException, DockerException) as exc:
        raise EngineUnavailable(type(exc).__name__) from None
    finally:
        _remove(container)


def isolation_options(user: tuple[int, int], *, memory: str, cpus: float) -> dict:
    """The isolation flags of a job's container (and of a sandbox on its workspace, apps/worker/sandbox/sandboxes.py):
    fixed here, never taken from a trigger. No network at all: a job's only way out is its gateway's socket."""
    uid, gid = user
    if uid == 0:
        raise ValueError("jobs never run as root")
    memory_limit = memory_bytes(memory)
    return dict(
        user=f"{uid}:{gid}",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=settings.PI_JOB_PIDS_LIMIT,
        mem_limit=memory_limit,
        memswap_limit=memory_limit,  # no swap beyond the memory limit
        nano_cpus=int(cpus * 1e9),
        shm_size="1g",
        init=True,
        network_mode="none",
        read_only=True,
        tmpfs=scratch_mounts(user),
    )


def _create_once_named(client: docker.DockerClient, job_id: str, **options):
    """The job's container. Its name is taken only by an earlier attempt of the same job whose worker died on this
    engine: that attempt was settled before this one could start, so nothing watches its container any more, and
    it goes first (its host's boot reaper would have removed it when that host came back)."""
    try:
        return client.containers.create(**options)
    except APIError as exc:
        if exc.status_code != 409:
            raise
    try:
        client.containers.get(options["name"]).remove(force=True)
        logger.warning("container_reaped job=%s why=earlier-attempt", job_id)
    except NotFound:
        pass
    return client.containers.create(**options)


def scratch_mounts(user: tuple[int, int]) -> dict[str, str]:
    """The writable scratch of a read-only container: /tmp for everyone, the home for the job user alone."""
    uid, gid = user
    options = "rw,nosuid,nodev,exec"
    return {"/tmp": f"{options},size={settings.PI_JOB_TMP_MB}m,mode=1777",
            JOB_HOME: f"{options},size={settings.PI_JOB_HOME_MB}m,uid={uid},gid={gid},mode=0700"}


def _wait(container, deadline: float) -> tuple[int | None, bool]:
    """Wait in short slices (room for cancel checks); past the deadline stop it: SIGTERM, SIGKILL after 5 s."""
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            logger.warning("job_timeout container=%s", container.name)
            container.stop(timeout=STOP_GRACE_SECONDS)
            result = container.wait(timeout=STOP_GRACE_SECONDS + 30)
            return result.get("StatusCode"), True
        try:
            result = container.wait(timeout=min(WAIT_SLICE_SECONDS, remaining))
            return result.get("StatusCode"), False
        except requests.exceptions.ConnectionError as exc:
            # A read timeout on the unix socket surfaces as a ConnectionError wrapping ReadTimeoutError.
            if "timed out" not in str(exc).lower():
                raise
        except requests.exceptions.ReadTimeout:
            pass


def _oom_killed(container) -> bool:
    """Only a SIGKILL exit is worth the extra inspect: did the kernel's OOM killer send it?"""
    container.reload()
    return bool(container.attrs.get("State", {}).get("OOMKilled"))


def _stdout_tail(container) -> bytes:
    output = container.logs(stdout=True, stderr=False, tail=200)
    return output[-OUTPUT_TAIL_BYTES:]


def _remove(container) -> None:
    try:
        container.remove(force=True)
    except NotFound:
        pass
    except (APIError, requests.RequestException, DockerException):
        # The boot reaper removes it next time; never let cleanup hide the run's outcome.
        logger.warning("container_remove_failed container=%s", container.name)
