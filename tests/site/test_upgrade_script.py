"""contrib/upgrade.sh as docs/deploying.md has an operator run it: as root, on a checkout the guide made (a release
tag checked out, no branch), with the host's pidispatch units loaded. The test builds its own tagged repository
holding this checkout's script, a stand-in manage.py and Makefile that write down what they were asked (and as
whom), and stand-ins for systemctl and runuser on the PATH."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid"}
UNITS = ["pidispatch-cron@hostA.service", "pidispatch-edge.service", "pidispatch-notify.service",
         "pidispatch-poller.service", "pidispatch-replayer.service", "pidispatch-web.service",
         "pidispatch-worker@hostA.service"]
MANAGE = """import os, sys
with open(os.environ["UPGRADE_LOG"], "a") as log:
    log.write("manage " + os.environ.get("RAN_AS", "root") + " " + " ".join(sys.argv[1:]) + "\\n")
sys.exit(1 if os.environ.get("FAIL_AT") and sys.argv[1] == os.environ["FAIL_AT"] else 0)
"""
MAKEFILE = "install:\n\techo make install $(shell git rev-parse --short HEAD) >> $$UPGRADE_LOG\n" \
           "image:\n\techo make image >> $$UPGRADE_LOG\n"
SYSTEMCTL = """#!/bin/sh
if [ "$1" = list-units ]; then
  for unit in {units}; do echo "$unit loaded active running pidispatch"; done
  echo "pidispatch-worker@.service not-found inactive dead pidispatch-worker@.service"
else
  echo "systemctl $*" >> "$UPGRADE_LOG"
fi
"""
RUNUSER = """#!/bin/sh
[ "$1" = -u ] || exit 2
user=$2; shift 3
RAN_AS=$user exec "$@"
"""


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **IDENTITY}).stdout.strip()


@pytest.fixture
def host(tmp_path):
    """A checkout of release 0.1.0 made as the guide makes it, whose origin also has 0.2.0."""
    origin = tmp_path / "origin"
    (origin / "contrib").mkdir(parents=True)
    (origin / "contrib" / "upgrade.sh").write_text((ROOT / "contrib" / "upgrade.sh").read_text())
    (origin / "manage.py").write_text(MANAGE)
    (origin / "Makefile").write_text(MAKEFILE)
    git(origin, "init", "-q", "-b", "main")
    git(origin, "add", ".")
    git(origin, "commit", "-qm", "0.1.0")
    git(origin, "tag", "0.1.0")
    (origin / "VERSION").write_text("0.2.0\n")
    git(origin, "add", ".")
    git(origin, "commit", "-qm", "0.2.0")
    git(origin, "tag", "0.2.0")
    checkout = tmp_path / "opt-pidispatch"
    git(tmp_path, "clone", "-q", str(origin), str(checkout))
    git(checkout, "-c", "advice.detachedHead=false", "checkout", "-q", "0.1.0")
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    for name, text in (("systemctl", SYSTEMCTL.format(units=" ".join(UNITS))), ("runuser", RUNUSER)):
        (stand_ins / name).write_text(text)
        (stand_ins / name).chmod(0o755)
    return {"checkout": checkout, "origin": origin, "bin": stand_ins, "log": tmp_path / "upgrade.log"}


def upgrade(host, release="0.2.0", **env):
    result = subprocess.run(
        ["bash", str(host["checkout"] / "contrib" / "upgrade.sh"), "hostA", release], capture_output=True, text=True,
        timeout=60, env={**os.environ, "PATH": f"{host['bin']}:{os.environ['PATH']}", "UPGRADE_LOG": str(host["log"]),
                         "PI_UPGRADE_PYTHON": sys.executable, "PI_UPGRADE_DOCTOR_WAIT": "5", **env})
    log = host["log"].read_text().splitlines() if host["log"].exists() else []
    return result, log


@pytest.mark.skipif(os.geteuid() != 0, reason="the script is run as root, as the guide says")
def test_it_upgrades_a_tagged_checkout_to_the_named_release_as_the_guide_sets_it_up(host):
    result, log = upgrade(host)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "==> hostA: upgraded to 0.2.0" in result.stdout
    assert git(host["checkout"], "rev-parse", "HEAD") == git(host["origin"], "rev-parse", "0.2.0^{commit}")
    release = git(host["origin"], "rev-parse", "--short", "0.2.0^{commit}")
    assert log == [
        "manage pidispatch fleet drain --host hostA --wait 3600 --note upgrade to 0.2.0 --by upgrade:hostA",
        f"make install {release}",  # on the release, not a branch
        "manage pidispatch migrate_fleet",
        "manage pidispatch collectstatic --noinput -v 0",
        "make image",
        "systemctl restart " + " ".join(UNITS),  # every unit the host has, the cron and notify ones too
        "manage pidispatch doctor",
        "manage pidispatch fleet undrain --host hostA --by upgrade:hostA",
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="the script is run as root, as the guide says")
def test_a_step_that_fails_undrains_the_host_and_names_the_step(host):
    result, log = upgrade(host, FAIL_AT="migrate_fleet")

    assert result.returncode != 0
    assert "==> hostA: FAILED at: migrate (exit 1)." in result.stderr
    assert "undrained again; fix the cause and run this again" in result.stderr
    assert log[-1] == "manage pidispatch fleet undrain --host hostA --by upgrade:hostA"
    assert not any(line.startswith("systemctl") for line in log)  # nothing restarted on a half-done upgrade


def test_a_release_that_does_not_exist_changes_nothing(host):
    before = git(host["checkout"], "rev-parse", "HEAD")
    result, log = upgrade(host, release="9.9.9", PI_UPGRADE_USER="")

    assert result.returncode != 0
    assert "no release tag 9.9.9" in result.stderr
    assert log == []  # not even drained
    assert git(host["checkout"], "rev-parse", "HEAD") == before


def test_it_needs_the_host_and_the_release():
    result = subprocess.run(["bash", str(ROOT / "contrib" / "upgrade.sh"), "hostA"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode != 0 and "usage: contrib/upgrade.sh <host name" in result.stderr
