"""`make run` holds its checkout from its first step (before the job image is built): a second one in the same
checkout is refused at once, naming the first, and the hold goes with the first process however it ends."""

import os
import subprocess
import sys

from tests.conftest import ROOT

SECOND = """
import sys
from pathlib import Path
from devtools import stack
stack.RUN_LOCK = Path(sys.argv[1])
try:
    stack.hold_the_checkout()
except SystemExit as refused:
    print(refused.code if isinstance(refused.code, str) else refused, file=sys.stderr)
    sys.exit(3)
print("held")
"""


def second_run(lock) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SECOND, str(lock)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_a_second_make_run_in_the_checkout_is_refused_while_the_first_holds_it(tmp_path, monkeypatch):
    from devtools import stack

    lock = tmp_path / "make-run.lock"
    monkeypatch.setattr(stack, "RUN_LOCK", lock)
    held = stack.hold_the_checkout()
    try:
        refused = second_run(lock)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert f"make run is running in this checkout already (pid {os.getpid()})" in refused.stderr
    finally:
        held.close()  # as the first process's end lets go of it
    assert second_run(lock).stdout.strip() == "held"
