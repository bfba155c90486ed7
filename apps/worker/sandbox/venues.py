"""Venues (`run.backend`, `PI_BACKENDS`): which container runtime on the worker host runs a job.

    local    the host's Docker engine (DOCKER_HOST or its default socket): what every job runs on
    podman   rootless Podman with the ancestor's extra flags (`--userns=keep-id`, private pid/ipc/uts/cgroup
             namespaces). Known to the trigger language so a file written for the ancestor imports and means
             the same, but this worker does not run it yet: blessed or not, a job asking for it is refused
             (`backend-unavailable`), never quietly run on Docker instead.

A host runs only the venues its environment blesses (`PI_BACKENDS`, default `local`): a job naming another
one is refused `backend-unblessed`. A trigger never widens that, it only picks among them. A job in a local
folder never runs on a remote venue (its workspace is a bind mount of this host's folder); none of the known
venues is remote today, so the rule stands ready in `trigger_problem` for the first one that is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
DEFAULT = "local"


@dataclass(frozen=True)
class Venue:
    name: str
    remote: bool  # runs its containers on another machine (a local folder cannot be mounted there)
    runnable: bool  # this worker can start a job's container on it
    why_not: str = ""  # for an unrunnable venue: what the refusal's log line says


VENUES = {
    "local": Venue("local", remote=False, runnable=True),
    "podman": Venue("podman", remote=False, runnable=False,
                    why_not="podman-not-implemented"),
}


def trigger_problem(value, *, local_folder: bool) -> str | None:
    """What is wrong with a trigger's `run.backend` (completes "run.backend ..."), or None."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        return f"must be a venue name: one of {', '.join(VENUES)}."
    venue = VENUES.get(value)
    if venue is None:
        return f"{value!r} is not a known venue; known: {', '.join(VENUES)}."
    if venue.remote and local_folder:
        return f"{value!r} runs jobs on another machine, and a job in a local folder runs on its own host."
    return None


def blessed() -> tuple[str, ...]:
    """The venues this host's environment allows (PI_BACKENDS)."""
    return tuple(settings.PI_BACKENDS)


def refusal(backend: str) -> tuple[str, str] | None:
    """(reason, why) when this host cannot run a job on `backend` ("" = the default venue), else None."""
    name = backend or DEFAULT
    if name not in blessed():
        return "backend-unblessed", "not-in-PI_BACKENDS"
    venue = VENUES.get(name)
    if venue is None:
        return "backend-unblessed", "unknown-venue"
    if not venue.runnable:
        return "backend-unavailable", venue.why_not
    return None
