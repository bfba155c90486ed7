"""A local job's workspace is the folder itself, mounted read-write: it must be a git repository with a
commit (so every change the agent makes can be seen and undone), and a dirty tree is refused unless
the run was forced. The container runs as the folder's owner, so what it writes stays the operator's.

The folder is writable by the agent, so its `.git/config` is untrusted: the checks here run git as the
folder's owner with a closed environment and `core.fsmonitor` off, and refuse a repository whose own
config would make git run a program (filters, fsmonitor, includes) before any git command reads it.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .gitrun import run_git

GIT_TIMEOUT_SECONDS = 30
# Keys of a repository's own config that name a program git may run, or pull in another config file.
UNSAFE_CONFIG = re.compile(r"^(core\.fsmonitor|filter\..+\.(clean|smudge|process)|include\.path|includeif\..+\.path)$")


class WorkspaceRefused(Exception):
    def __init__(self, reason: str, hint: str):
        super().__init__(hint)
        self.reason = reason
        self.hint = hint


@dataclass(frozen=True)
class LocalWorkspace:
    folder: Path
    owner: tuple[int, int]


def _unsafe_config_keys(path: Path, owner: tuple[int, int]) -> list[str]:
    """Reads `.git/config` as a file (`--file` runs nothing and follows no include)."""
    config = path / ".git" / "config"
    if not config.is_file():
        return []
    listing = run_git(path, "config", "--file", str(config), "--name-only", "--list",
                      timeout=GIT_TIMEOUT_SECONDS, as_user=owner)
    names = listing.stdout.decode(errors="replace").lower().split()
    values = {}
    if "core.fsmonitor" in names:  # `false` is harmless
        value = run_git(path, "config", "--file", str(config), "--get", "core.fsmonitor",
                        timeout=GIT_TIMEOUT_SECONDS, as_user=owner).stdout.decode(errors="replace").strip().lower()
        values["core.fsmonitor"] = value
    return sorted({name for name in names if UNSAFE_CONFIG.fullmatch(name)
                   and values.get(name) not in ("false", "0", "no", "off")})


def check_local_folder(folder: str, *, force: bool) -> LocalWorkspace:
    path = Path(folder)
    if not path.is_absolute() or not path.is_dir():
        raise WorkspaceRefused("workspace-missing", f"{path.name or folder} is not a folder on this host")
    stat = os.stat(path)
    owner = (stat.st_uid, stat.st_gid)
    if stat.st_uid == 0:
        raise WorkspaceRefused(
            "job-user-unmappable", "the folder belongs to root and jobs never run as root; chown it to its user"
        )
    if not (path / ".git").exists():
        raise WorkspaceRefused("workspace-not-a-repo", "the folder is not the root of a git repository")
    try:
        unsafe = _unsafe_config_keys(path, owner)
        if unsafe:
            raise WorkspaceRefused(
                "workspace-config-unsafe",
                f"the repository's own .git/config sets {', '.join(unsafe)}, which would make git run a program; "
                "remove it (the agent can write that file)",
            )
        # One call answers both questions: `# branch.oid (initial)` means no commit, other lines are changes.
        status = run_git(path, "status", "--porcelain=v2", "--branch", timeout=GIT_TIMEOUT_SECONDS, as_user=owner)
    except (subprocess.TimeoutExpired, OSError):
        raise WorkspaceRefused("workspace-not-a-repo", "git did not answer about the folder in time") from None
    if status.returncode != 0:
        raise WorkspaceRefused("workspace-not-a-repo", "git status failed: the folder is not a usable repository")
    lines = status.stdout.decode(errors="replace").splitlines()
    if "# branch.oid (initial)" in lines:
        raise WorkspaceRefused("workspace-no-commit", "the repository has no commit yet")
    if any(not line.startswith("# ") for line in lines if line) and not force:
        raise WorkspaceRefused("workspace-dirty", "the folder has uncommitted changes; commit or stash them, or force")
    return LocalWorkspace(folder=path, owner=owner)
