"""Who this worker host is: a declared name, or its sanitised hostname (undeclared).

A host is declared by `PI_WORKER_NAME`, or by the host queue its worker was started on
(`rqworker pi-jobs pi-jobs@hostA` declares `hostA`); the two must agree.
"""

import re
import socket
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .queues import HOST_NAME_PATTERN, host_queue, is_valid_host_name

_declared_by_queue: str | None = None


@dataclass(frozen=True)
class HostIdentity:
    name: str
    declared: bool  # declaring a name arms the host queue and routing to it


def sanitise_host_name(raw: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", raw.split(".")[0] or raw).lstrip("._-")[:64]
    return name if is_valid_host_name(name) else "host"


def _configured_name() -> str:
    name = (settings.PI_WORKER_NAME or "").strip()
    if name and not is_valid_host_name(name):
        raise ImproperlyConfigured(
            f"PI_WORKER_NAME={name!r} is not a valid worker name: use letters, digits, '.', '_' or '-' "
            f"(pattern {HOST_NAME_PATTERN.pattern})."
        )
    return name


def declare_from_queue(name: str) -> None:
    """Called by a worker started on `pi-jobs@<name>`."""
    global _declared_by_queue
    configured = _configured_name()
    if configured and configured != name:
        raise ImproperlyConfigured(
            f"this worker is PI_WORKER_NAME={configured} but was asked to drain {host_queue(name)}: "
            f"drain {host_queue(configured)} instead, or change PI_WORKER_NAME."
        )
    _declared_by_queue = name


def this_host() -> HostIdentity:
    name = _configured_name() or _declared_by_queue
    if name:
        return HostIdentity(name, True)
    return HostIdentity(sanitise_host_name(socket.gethostname()), False)


def code_version() -> str:
    """The installed pidispatch version, as the registry row reports it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pidispatch")
    except PackageNotFoundError:
        return "unknown"
