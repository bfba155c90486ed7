"""Running an operator's host script: a wait-for check (apps/worker/gates/waitfor.py), a secret resolver
(apps/worker/gates/secrets.py) or the failure hook (apps/worker/failure_hook.py). Each speaks with an exit code; a
resolver also answers on stdout.

The script gets an argv (never a shell), stdin from /dev/null (the failure hook: a small JSON document), stderr
discarded, a closed environment (PATH, HOME, USER, LOGNAME, LANG, LC_ALL, TMPDIR: never the worker's keys and
tokens; a script that needs more sets it itself), its own session (so a timeout stops everything it started),
and a time bound: past it the session gets SIGTERM, then SIGKILL 2 s later. The answer is decided when the
script exits, not when its stdout closes, so a background grandchild holding the pipe cannot turn a prompt answer into a
timeout. Captured stdout is bounded: a script that prints more than it may is stopped, its answer marked
`overflow`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

CLOSED_ENVIRONMENT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
KILL_GRACE_SECONDS = 2.0
_READ_SLICE_SECONDS = 0.05
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ScriptAnswer:
    """`code` is None when the script gave no exit code: it could not be spawned, or ran out of time."""

    code: int | None
    stdout: bytes = b""
    spawn_failed: bool = False
    timed_out: bool = False
    overflow: bool = False  # printed more than `capture_bytes`; stopped, and stdout cut at the limit

    @property
    def fault(self) -> str:
        """A fixed token for the log (`spawn-failed`, `timeout`, `overflow`, `exit-<n>`, `signal-<n>`)."""
        if self.spawn_failed:
            return "spawn-failed"
        if self.timed_out:
            return "timeout"
        if self.overflow:
            return "overflow"
        return f"signal-{-self.code}" if self.code is not None and self.code < 0 else f"exit-{self.code}"


def closed_environment() -> dict[str, str]:
    """What a host script sees of the worker's environment: the closed list, and a PATH."""
    environment = {name: os.environ[name] for name in CLOSED_ENVIRONMENT if os.environ.get(name)}
    environment.setdefault("PATH", DEFAULT_PATH)
    return environment


def run_script(argv: list[str], *, timeout_seconds: float, capture_bytes: int = 0,
               stdin: bytes | None = None) -> ScriptAnswer:
    """Run `argv` to its exit. `capture_bytes` 0 discards stdout. `stdin` (small: it is written whole before
    anything is read) is the script's input, else /dev/null."""
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE if capture_bytes else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=closed_environment(), shell=False, close_fds=True,
            start_new_session=True,
        )
    except OSError:  # missing, not executable, a bad interpreter line
        return ScriptAnswer(code=None, spawn_failed=True)
    deadline = time.monotonic() + timeout_seconds
    if stdin is not None:
        with contextlib.suppress(OSError):  # it exited, or closed its input, without reading it all
            process.stdin.write(stdin)
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        output, overflow = (_read_bounded(process, capture_bytes, deadline) if capture_bytes else (b"", False))
        if overflow:
            _stop(process)
            return ScriptAnswer(code=None, stdout=output[:capture_bytes], overflow=True)
        try:
            code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop(process)
            return ScriptAnswer(code=None, timed_out=True)
        return ScriptAnswer(code=code, stdout=output)
    finally:
        if process.stdout is not None:
            process.stdout.close()


def _read_bounded(process: subprocess.Popen, limit: int, deadline: float) -> tuple[bytes, bool]:
    """Stdout until EOF, the script's exit (and what it left in the pipe), the deadline, or more than `limit`."""
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    output = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            exited = process.poll() is not None
            if not selector.select(timeout=0 if exited else min(_READ_SLICE_SECONDS, remaining)):
                if exited:
                    break  # gone, and nothing left in the pipe: a grandchild holding it changes nothing
                continue
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                break
            output += chunk
            if len(output) > limit:
                return bytes(output), True
    return bytes(output), False


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the script's whole session, SIGKILL after the grace."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
