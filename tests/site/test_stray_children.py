"""What make run forked and lost hold of (a stop signal between a spawn's fork and Popen's return) is stopped
with everything else: `services.stop_stray_children`, run in a process of its own as make run's is."""

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def carrying(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"STRAY_MARKER={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run_parent(script: str, marker: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "STRAY_MARKER": marker})


def test_children_no_service_holds_are_stopped_with_their_groups():
    marker = uuid.uuid4().hex
    parent = run_parent("""
        import subprocess, time
        from devtools import services
        # Spawned and dropped, as a spawn cut short by a stop signal leaves them: one in a session of its own
        # with a child of its own, one in ours, one that ignores SIGTERM.
        subprocess.Popen(["sh", "-c", "sleep 300 & sleep 301; wait"], start_new_session=True)
        subprocess.Popen(["sleep", "302"])
        subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 303 & wait"], start_new_session=True)
        time.sleep(0.5)
        strays = services.stop_stray_children(seconds=1)
        print(len(strays))
    """, marker)
    assert parent.returncode == 0, parent.stderr
    assert parent.stdout.split() == ["3"]
    assert carrying(marker) == []


def test_a_process_with_no_strays_stops_none():
    parent = run_parent("""
        import subprocess
        from devtools import services
        subprocess.run(["true"])  # spawned, waited for: not a stray
        print(services.stop_stray_children(seconds=1))
    """, uuid.uuid4().hex)
    assert parent.returncode == 0, parent.stderr
    assert parent.stdout.split() == ["[]"]
