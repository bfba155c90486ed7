"""What one `make test` owns, so that a stop signal stops all of it and a later run clears what a killed one left.

A run owns its folder (`<tmp>/pidispatch-test-XXXX/`, named by its `stack` file: the stack process's identity, as
the host registry tells processes apart) and every process that carries its mark: those that inherit
PIDISPATCH_TEST_RUN=<its id> in their environment (pytest, its xdist processes, the workers and servers the tests
start, dockerd and its containerd) and those working inside its folder (redis-server overwrites its environment
with its title, but it works in its data folder, and every test's tmp_path lies in the run's folder too). A
process of another run, or of nothing of ours, is never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from apps.fleet.registry import process_identity

MARK = "PIDISPATCH_TEST_RUN"
PREFIX = "pidispatch-test-"


def alive(run_id: str) -> bool:
    """Whether the stack process that wrote `run_id` (its registry.process_identity) still runs."""
    return process_identity(stack_pid(run_id)) == run_id if stack_pid(run_id) else False


def stack_pid(run_id: str) -> int:
    pid = run_id.rsplit("/", 2)[-2] if run_id.count("/") >= 2 else ""
    return int(pid) if pid.isdigit() else 0


class TestRun:
    """This run: its folder, and its mark in this process's environment (inherited by everything it starts)."""

    def __init__(self):
        self.id = process_identity()
        self.folder = Path(tempfile.mkdtemp(prefix=PREFIX))
        self.folder.chmod(0o755)
        (self.folder / "stack").write_text(self.id)
        os.environ[MARK] = self.id

    def processes(self, except_groups: set[int] = frozenset()) -> list[int]:
        """Its processes, but those in the process groups named (its services, which stop in order)."""
        return [pid for pid in owned_processes(self.id, self.folder) if _group(pid) not in except_groups]

    def remove_folder(self) -> None:
        remove_folder(self.folder)


def owned_processes(run_id: str, folder: Path) -> list[int]:
    """Every process carrying the run's mark or working inside its folder, but this one."""
    mark = f"{MARK}={run_id}".encode()
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            marked = mark in (entry / "environ").read_bytes().split(b"\0")
            inside = Path(os.readlink(entry / "cwd").removesuffix(" (deleted)")).is_relative_to(folder)
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if marked or inside:
            found.append(int(entry.name))
    return found


def stop_processes(pids: list[int], grace: float) -> None:
    """SIGTERM to each, then SIGKILL to what is left after `grace` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_exists(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _exists(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended: its parent has yet to reap it


def remove_folder(folder: Path) -> None:
    """The folder, with whatever a killed engine or test left mounted inside it."""
    with contextlib.suppress(OSError):
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if Path(m).is_relative_to(folder)), reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def clear_killed_runs(say) -> None:
    """What runs killed outright (SIGKILL: no cleanup ran) left: their processes and their folders."""
    for stack_file in Path(tempfile.gettempdir()).glob(f"{PREFIX}*/stack"):
        try:
            run_id = stack_file.read_text().strip()
        except OSError:
            continue
        if alive(run_id):
            continue  # another make test, running now
        pids = owned_processes(run_id, stack_file.parent)
        stop_processes(pids, grace=5)
        remove_folder(stack_file.parent)
        say(f"cleared what a killed make test left ({len(pids)} processes, {stack_file.parent})")
