"""`var/dev.env`: what `make run` (devtools/stack.py) tells the commands run beside it.

Two parts. The demo's generated secrets (its webhook secret, its GitHub account id) are kept across runs.
The addresses of the services the running `make run` started (its private Redis on a port it picked, its
private Docker engine's socket, the demo's stand-ins) follow the line `PIDISPATCH_STACK_PID=<pid>`: they are
replaced when `make run` starts, removed when it stops, and ignored by readers once that process is gone
(killed with SIGKILL, say), so a stale address never sends a command to the wrong place.

Settings apply the file with the real environment winning over it. No Django here: the stack writes it
before any settings exist.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

STACK_PID = "PIDISPATCH_STACK_PID"
HEADER = ("# Written by `make run` (devtools/stack.py) for the commands run beside it; the environment wins.\n"
          "# The demo's generated secrets are kept. The lines from PIDISPATCH_STACK_PID on are the services\n"
          "# of the `make run` with that pid: replaced when it starts, removed when it stops.\n")


@dataclass
class DevEnv:
    kept: dict[str, str] = field(default_factory=dict)
    services: dict[str, str] = field(default_factory=dict)
    stack_pid: int | None = None


def read(path: Path) -> DevEnv:
    found = DevEnv()
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    section = found.kept
    for line in lines:
        if "=" not in line or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if key == STACK_PID:
            found.stack_pid = int(value) if value.isdigit() else None
            section = found.services
            continue
        section[key] = value
    return found


def stack_alive(pid: int | None) -> bool:
    """The `make run` that wrote the addresses still runs (a reused pid runs something else)."""
    if not pid:
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"devtools.stack" in command and b"run" in command


def write(path: Path, kept: dict[str, str], services: dict[str, str] | None = None, pid: int | None = None) -> None:
    """The whole file at once (a reader never sees half of it), this user's only."""
    text = HEADER + "".join(f"{key}={value}\n" for key, value in sorted(kept.items()))
    if services:
        text += f"{STACK_PID}={pid or os.getpid()}\n"
        text += "".join(f"{key}={value}\n" for key, value in sorted(services.items()) if value)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(staged, path)


def apply(path: Path, environ=os.environ) -> None:
    """Fill in what the environment does not set: the kept secrets, and the services while their stack runs."""
    found = read(path)
    values = dict(found.kept)
    if stack_alive(found.stack_pid):
        values.update(found.services)
    for key, value in values.items():
        environ.setdefault(key, value)
