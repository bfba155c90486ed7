"""What tests of real worker processes watch: a host's registry row, job containers' lifetimes from the
engine's own events, and a worker's work horse."""

import os
import shutil
import threading
from pathlib import Path

import docker

from apps.fleet import registry
from devtools import services


class PrivateRedis:
    """A redis-server of a test's own, on one port and data folder across restarts (persistent, like production's):
    stopped and started again, emptied, or started from an older copy of its data."""

    def __init__(self, data_dir):
        self.data_dir, self.port = data_dir, services.free_port()
        self.service = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.service = services.start_redis(self.data_dir, self.port, persistent=True)

    def stop(self) -> None:
        self.service.stop()  # SIGTERM: it writes its append-only file and exits

    def copy_data(self, to: Path) -> None:
        """A copy of its data as it is on disk now (stop it first for a consistent one)."""
        shutil.copytree(self.data_dir, to)

    def restart_with(self, data: Path | None) -> None:
        """Stopped, its data replaced by `data` (None: nothing, an empty Redis), and started again."""
        self.stop()
        shutil.rmtree(self.data_dir)
        if data is not None:
            shutil.copytree(data, self.data_dir)
        self.start()


def host_row(redis_conn, name) -> registry.HostRow | None:
    return next((h for h in registry.read_hosts(redis_conn) if h.name == name), None)


class ContainerLifetimes:
    """Start and stop instants of job containers, from the engine's own event stream."""

    def __init__(self, engine=None):
        self.engine = engine or docker.from_env()
        self.events = []
        self._stream = self.engine.events(decode=True, filters={"label": "pidispatch.job", "type": "container"})
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        try:
            for event in self._stream:
                if event.get("status") in ("start", "die"):
                    self.events.append((event["Actor"]["Attributes"]["pidispatch.job"], event["status"],
                                        int(event["timeNano"])))
        except Exception:  # the stream closes when the test ends
            pass

    def started(self):
        return {job for job, status, _ in self.events if status == "start"}

    def intervals(self):
        spans = {}
        for job, status, at in self.events:
            spans.setdefault(job, {})[status] = at
        return {job: (span["start"], span["die"]) for job, span in spans.items() if len(span) == 2}

    def close(self):
        self._stream.close()


def assert_no_overlap(intervals):
    ordered = sorted(intervals.values())
    for (_, first_end), (second_start, _) in zip(ordered, ordered[1:], strict=False):
        assert second_start >= first_end, "two containers ran at the same time"


def horse_of(worker_pid: int) -> int:
    """The work horse: the worker's child that leads its own process group (RQ's scheduler does not)."""
    children = Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text().split()
    horses = [int(pid) for pid in children if os.getpgid(int(pid)) == int(pid)]
    assert len(horses) == 1, children
    return horses[0]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
