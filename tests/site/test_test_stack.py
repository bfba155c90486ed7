"""`make test` leaves nothing of its own running: after SIGINT, SIGTERM or SIGHUP its redis-server, Docker engine
(and containerd), pytest and what the tests started are gone within 30 s, its folder too; a run killed outright
(SIGKILL, no cleanup at all) is cleared by the next one. Each run here is a real `python -m devtools.stack test`
with its own var folder (its own engine), running one test that starts a process of its own and sleeps an hour."""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from devtools import test_runs
from tests.conftest import ROOT, wait_for

SLEEPER = '''
import subprocess, time
from pathlib import Path

def test_sleeps_an_hour():
    # What a test starts in a session of its own (a worker, a server): out of pytest's process group.
    subprocess.Popen(["sleep", "3600"], start_new_session=True)
    Path(__file__).with_name("sleeping").write_text("yes")
    time.sleep(3600)
'''


class NestedRun:
    def __init__(self, tmp_path: Path, name: str, test_file: Path):
        self.log = tmp_path / f"{name}.log"
        # Not this run's services (it starts its own), but this run's mark: were this test stopped midway, this run's
        # own stop would reach the nested one, which then stops what it started.
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("PIDISPATCH_TEST_S", "PYTEST_", "DATABASE_URL"))}
        env.update(PI_VAR_DIR=str(tmp_path / "var"), PI_TEST_PROCESSES="1")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "devtools.stack", "test", "--", str(test_file),
                                             "-p", "no:cacheprovider"], cwd=ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)

    def identity(self) -> tuple[str, Path]:
        """The run's id and folder, from the folder's `stack` file."""
        def found():
            for stack_file in Path(tempfile.gettempdir()).glob(f"{test_runs.PREFIX}*/stack"):
                run_id = stack_file.read_text()
                if test_runs.stack_pid(run_id) == self.process.pid:
                    return run_id, stack_file.parent
            return None

        return wait_for(found, timeout=60, what="the nested run's folder")

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def leftovers(run_id: str, folder: Path) -> list[str]:
    """Each process the run owns (its mark, or working in its folder), as `pid command`."""
    found = []
    for pid in test_runs.owned_processes(run_id, folder):
        with contextlib.suppress(OSError):  # gone meanwhile
            found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes().replace(bytes(1), b' ').decode()[:120]}")
    return found


@pytest.fixture
def sleeper(tmp_path):
    folder = tmp_path / "nested"
    folder.mkdir()
    (folder / "test_sleeper.py").write_text(SLEEPER)
    return folder / "test_sleeper.py"


@pytest.fixture
def nested_runs():
    """Each nested run is stopped when the test ends, whatever became of it."""
    runs = []
    yield runs
    for run in runs:
        run.stop()


def started(tmp_path, sleeper, nested_runs) -> NestedRun:
    nested = NestedRun(tmp_path, "run", sleeper)
    nested_runs.append(nested)
    wait_for(lambda: sleeper.with_name("sleeping").exists() or nested.process.poll() is not None, timeout=300,
             what="the nested run's test to start sleeping")
    assert nested.process.poll() is None, nested.output()
    return nested


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_leaves_nothing_of_the_run_within_30_s(tmp_path, sleeper, nested_runs, stop):
    nested = started(tmp_path, sleeper, nested_runs)
    run_id, folder = nested.identity()
    mine = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in test_runs.owned_processes(run_id, folder)}
    assert {"redis-server", "dockerd", "containerd", "sleep"} <= mine, mine

    nested.process.send_signal(stop)
    nested.process.wait(30)
    assert nested.process.returncode == 128 + stop, nested.output()
    assert leftovers(run_id, folder) == []
    assert not folder.exists()


def test_the_next_run_clears_what_a_killed_run_left(tmp_path, sleeper, nested_runs):
    nested = started(tmp_path, sleeper, nested_runs)
    run_id, folder = nested.identity()
    nested.process.kill()  # no cleanup at all: its pytest, engine and Redis keep running
    nested.process.wait(30)
    assert len(leftovers(run_id, folder)) >= 4

    passing = sleeper.with_name("test_passing.py")
    passing.write_text("def test_passes():\n    assert True\n")
    following = NestedRun(tmp_path, "following", passing)
    nested_runs.append(following)
    assert following.process.wait(300) == 0, following.output()
    assert "cleared what a killed make test left" in following.output()
    assert leftovers(run_id, folder) == [] and not folder.exists()
