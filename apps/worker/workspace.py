"""A local job's workspace is the folder itself, mounted read-write: it must be a git repository with a
commit (so every change the agent makes can be seen and undone), and a dirty tree is refused unless
the run was forced. The container runs as the folder's owner, so what it writes stays the operator's.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


class WorkspaceRefused(Exception):
    def __init__(self, reason: str, hint: str):
        super().__init__(hint)
        self.reason = reason
        self.hint = hint


@dataclass(frozen=True)
class LocalWorkspace:
    folder: Path
    owner: tuple[int, int]


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess:
    # safe.directory: the worker (often root) inspects a folder another user owns.
    return subprocess.run(
        ["git", "-c", f"safe.directory={folder}", "-C", str(folder), *args],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )


def check_local_folder(folder: str, *, force: bool) -> LocalWorkspace:
    path = Path(folder)
    if not path.is_absolute() or not path.is_dir():
        raise WorkspaceRefused("workspace-missing", f"{path.name or folder} is not a folder on this host")
    if not (path / ".git").exists():
        raise WorkspaceRefused("workspace-not-a-repo", "the folder is not the root of a git repository")
    if _git(path, "rev-parse", "--verify", "--quiet", "HEAD").returncode != 0:
        raise WorkspaceRefused("workspace-no-commit", "the repository has no commit yet")
    status = _git(path, "status", "--porcelain")
    if status.returncode != 0:
        raise WorkspaceRefused("workspace-not-a-repo", "git status failed: the folder is not a usable repository")
    if status.stdout.strip() and not force:
        raise WorkspaceRefused("workspace-dirty", "the folder has uncommitted changes; commit or stash them, or force")
    stat = os.stat(path)
    if stat.st_uid == 0:
        raise WorkspaceRefused(
            "job-user-unmappable", "the folder belongs to root and jobs never run as root; chown it to its user"
        )
    return LocalWorkspace(folder=path, owner=(stat.st_uid, stat.st_gid))
