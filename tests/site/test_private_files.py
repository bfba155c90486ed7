"""What the installation keeps on disk is its own user's only: `var/` 0700, the secret key and the SQLite
database (and its log files) 0600. The key is made once, whole, and the fresh database opens for every one
of several processes starting at once on a fresh installation; an empty key file stops the start with what to
do. (Job folders: tests/worker/test_worker_forge_jobs.py.)"""

import json
import os
import subprocess
import sys
import time

from tests.conftest import ROOT

START = """
import json, sys, time
from pathlib import Path
go = Path(sys.argv[1]) if len(sys.argv) > 1 else None
while go is not None and not go.exists():
    time.sleep(0.001)
import django
django.setup()
from django.conf import settings
from django.db import connection
with connection.cursor() as cursor:  # SQLite creates the database and its log files now
    cursor.execute("CREATE TABLE IF NOT EXISTS probe (x integer)")
    cursor.execute("INSERT INTO probe VALUES (1)")
# The log files are gone once the last connection closes: their modes are read while this one is open.
modes = {}
for path in [settings.VAR_DIR, *settings.VAR_DIR.iterdir()]:
    try:
        modes[path.name] = oct(path.stat().st_mode & 0o777)
    except FileNotFoundError:
        pass  # a racing start's staged key or SQLite's rollback journal, gone since the listing
print(json.dumps({"key": settings.SECRET_KEY, "modes": modes}))
"""


def start_env(var_dir) -> dict:
    """A process of a fresh installation in `var_dir`: its own SQLite database and a generated key."""
    env = {name: value for name, value in os.environ.items() if name not in ("DATABASE_URL", "DJANGO_SECRET_KEY")}
    return {**env, "PI_VAR_DIR": str(var_dir), "DJANGO_SETTINGS_MODULE": "pidispatch_site.settings"}


def start(var_dir) -> dict:
    """Starts a process, and returns its key and the modes of `var/` and what is in it, or its error."""
    started = subprocess.run([sys.executable, "-c", START], cwd=ROOT, env=start_env(var_dir), capture_output=True,
                             text=True, timeout=120)
    return json.loads(started.stdout) if started.returncode == 0 else {"error": started.stderr}


def test_a_first_start_keeps_var_the_key_and_the_database_to_its_own_user(tmp_path):
    var = tmp_path / "var"

    started = start(var)

    files = ("secret_key", "pidispatch.sqlite3", "pidispatch.sqlite3-wal", "pidispatch.sqlite3-shm")
    assert {name: started["modes"].get(name) for name in ("var", *files)} == {"var": "0o700",
                                                                              **dict.fromkeys(files, "0o600")}
    assert started["key"] == (var / "secret_key").read_text()


def test_an_older_installations_loose_modes_are_tightened_and_its_key_kept(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    (var / "secret_key").write_text("an-older-key\n")
    (var / "pidispatch.sqlite3").touch()
    for path in (var, var / "secret_key", var / "pidispatch.sqlite3"):
        path.chmod(0o755 if path.is_dir() else 0o644)

    started = start(var)

    assert started["key"] == "an-older-key"
    assert {name: started["modes"][name] for name in ("var", "secret_key", "pidispatch.sqlite3")} == {
        "var": "0o700", "secret_key": "0o600", "pidispatch.sqlite3": "0o600"}


def test_an_empty_key_file_stops_the_start_and_says_what_to_do(tmp_path):
    var = tmp_path / "var"
    var.mkdir()
    (var / "secret_key").touch()

    error = start(var)["error"]

    assert f"The secret key file {var / 'secret_key'} is empty. Delete it and start again" in error
    assert "or set DJANGO_SECRET_KEY" in error


def test_processes_starting_at_once_on_a_fresh_installation_agree_on_one_key(tmp_path):
    var, go = tmp_path / "var", tmp_path / "go"
    starts = [subprocess.Popen([sys.executable, "-c", START, str(go)], cwd=ROOT, env=start_env(var),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(12)]
    time.sleep(3)  # each has imported Python and waits for the word
    go.touch()

    answers = [process.communicate(timeout=120) for process in starts]

    failed = [stderr for process, (_, stderr) in zip(starts, answers, strict=True) if process.returncode]
    assert not failed, failed[0]
    keys = {json.loads(stdout)["key"] for stdout, _ in answers}
    assert keys == {(var / "secret_key").read_text()} and len(keys.pop()) > 50
    assert sorted(path.name for path in var.iterdir() if "secret" in path.name) == ["secret_key"]  # nothing staged


CONNECT_IN_ROUNDS = """
import sqlite3, sys, time
from pathlib import Path
from pidispatch_site.sqlite_file import prepare_database_file
folder, rounds = Path(sys.argv[1]), int(sys.argv[2])
refused = []
for number in range(rounds):
    while not (folder / f"go-{number}").exists():
        time.sleep(0.0005)
    database = folder / f"round-{number}.sqlite3"
    prepare_database_file(database, 20)
    connection = sqlite3.connect(database, timeout=20)  # what Django's connection then runs first
    try:
        connection.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError as error:
        refused.append(f"round {number}: {error}")
    connection.close()
print("\\n".join(refused))
"""


def test_first_connections_racing_on_a_fresh_database_all_open_it(tmp_path):
    """Twelve processes opening a fresh database at once, twenty times over: without the file put in WAL mode
    first, about one round in five refuses a connection at once with "database is locked"."""
    rounds = 20
    starts = [subprocess.Popen([sys.executable, "-c", CONNECT_IN_ROUNDS, str(tmp_path), str(rounds)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(12)]
    time.sleep(2)  # each has imported Python and waits for the first round
    for number in range(rounds):
        (tmp_path / f"go-{number}").touch()
        time.sleep(0.15)

    answers = [process.communicate(timeout=120) for process in starts]

    assert [stderr for _, stderr in answers if stderr] == []
    assert [stdout.strip() for stdout, _ in answers if stdout.strip()] == []
    modes = {oct((tmp_path / f"round-{number}.sqlite3").stat().st_mode & 0o777) for number in range(rounds)}
    assert modes == {"0o600"}
