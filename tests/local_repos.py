"""Git repositories on this host for local jobs: a folder their owner can reach, under the folder root `make test`
declares (PI_LOCAL_ROOTS), one committed repository owned by OWNER (a uid no test runs as), and git as root may run
it there; a skills-folder root (PI_SKILLS_ROOTS) beside it. Fixtures: `owner_space`, `repo`, `skills_space`."""

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings

OWNER = (1234, 1234)


def git(folder, *args):
    subprocess.run(["git", "-c", f"safe.directory={folder}", "-C", str(folder), *args], check=True,
                   capture_output=True)


def local_root() -> Path:
    """The folder root this host declares for the tests (`make test` makes it, PI_LOCAL_ROOTS names it)."""
    return Path(settings.PI_LOCAL_ROOTS[0])


def skills_root() -> Path:
    """The skills-folder root this host declares for the tests (`make test` makes it, PI_SKILLS_ROOTS names it)."""
    return Path(settings.PI_SKILLS_ROOTS[0])


@contextmanager
def readable_folder(root: Path, prefix: str):
    """A new folder under `root` that every user may pass through (pytest's own temp folders are root-only, 0700)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def skills_space():
    """A folder every user may read, under the skills root: where a test puts a trigger's skills folder."""
    with readable_folder(skills_root(), "pidispatch-skills-") as base:
        yield base


@pytest.fixture
def owner_space():
    """A folder the repositories' owner can reach, under the folder root."""
    with readable_folder(local_root(), "pidispatch-local-") as base:
        yield base


def committed_repository(folder, readme="hello\n"):
    """A new repository in `folder` with one commit (README.md), as root made it."""
    folder.mkdir()
    git(folder, "init", "-q", "-b", "main")
    (folder / "README.md").write_text(readme)
    git(folder, "add", ".")
    git(folder, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "init")
    return folder


@pytest.fixture
def repo(owner_space):
    folder = committed_repository(owner_space / "app")
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, *OWNER)
    return folder
