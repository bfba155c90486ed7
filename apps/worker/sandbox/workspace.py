"""A local job's workspace is the folder itself, mounted read-write: it must lie under a root this host declares
and hold none of the deployment's own files (folder_roots.py: `folder-not-allowed`, judged before anything looks
inside it), be a git repository with a commit (so every change the agent makes can be seen and undone), and a
dirty tree is refused unless the run was forced. The container runs as the folder's owner, so what it writes
stays the operator's.

The folder is writable by the agent, so its git configuration is untrusted, and `git status` runs on the
host as the folder's owner. Before status runs, the configuration git will really use is read (`git config
--list` follows includes, the worktree config and a common directory, and runs nothing), and a repository
is refused whose git would run a program or read its configuration from elsewhere: filters, fsmonitor,
includes, another worktree or git directory, submodules (status runs git inside each, under that
submodule's own config), a promisor remote (status would fetch missing objects). Every git call here has a
closed environment, no discovery above the folder, fsmonitor and hooks off.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from apps.worker.sandbox import folder_roots
from apps.worker.sandbox.gitrun import run_git, unsafe_settings

logger = logging.getLogger("pidispatch.workspace")

FOLDER_NOT_ALLOWED = "folder-not-allowed"

GIT_TIMEOUT_SECONDS = 30
GITLINK_MODE = b"160000 "


class WorkspaceRefused(Exception):
    def __init__(self, reason: str, hint: str):
        super().__init__(hint)
        self.reason = reason
        self.hint = hint


@dataclass(frozen=True)
class LocalWorkspace:
    folder: Path
    owner: tuple[int, int]
    head: str = ""  # the folder's HEAD commit, as git status named it


def folder_git(path: Path, owner: tuple[int, int], *args: str,
               stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """git on this folder's own `.git` only: naming both directories stops git from looking above the folder.
    Only on a folder `check_local_folder` passed (its configuration was judged safe first)."""
    return run_git(path, f"--git-dir={path / '.git'}", f"--work-tree={path}", *args,
                   timeout=GIT_TIMEOUT_SECONDS, as_user=owner, stdin=stdin)


_git = folder_git


def _refuse_unsafe(why: str) -> WorkspaceRefused:
    return WorkspaceRefused("workspace-config-unsafe",
                            f"{why}; a local job needs a plain repository (the agent can write the folder, "
                            "and git runs on this host)")


def _config_entries(path: Path, owner: tuple[int, int]) -> list[tuple[str, str, str | None]]:
    """(origin, key, value) of every setting git reads for this folder, our own `-c` ones left out. A key
    written without `=` has no value (a switch that is then on)."""
    listing = _git(path, owner, "config", "--list", "--show-scope", "--show-origin", "-z")
    if listing.returncode != 0:
        raise WorkspaceRefused("workspace-not-a-repo", "git could not read the repository's configuration")
    fields = listing.stdout.decode(errors="replace").split("\0")
    entries = []
    for scope, origin, entry in zip(fields[0::3], fields[1::3], fields[2::3], strict=False):
        key, has_value, value = entry.partition("\n")
        if scope != "command":
            entries.append((origin, key.lower(), value if has_value else None))
    return entries


def _check_repository_safe(path: Path, owner: tuple[int, int]) -> None:
    """Refuses, before any git command but `git config` reads the repository, what would run a program."""
    git_dir = path / ".git"
    if git_dir.is_symlink() or not git_dir.is_dir():
        raise _refuse_unsafe("the folder's .git is not a directory but a file or link to another git directory")
    if os.path.lexists(git_dir / "commondir"):
        raise _refuse_unsafe("the folder's .git/commondir points git at another git directory")
    unsafe = unsafe_settings(_config_entries(path, owner))
    if unsafe:
        raise _refuse_unsafe(f"the repository's git configuration sets {', '.join(unsafe)}, "
                             "which would make git run a program or read another repository")
    if os.path.lexists(path / ".gitmodules"):
        raise _refuse_unsafe("the repository has submodules (.gitmodules), and git status runs git inside each")
    index = _git(path, owner, "ls-files", "--stage", "-z")
    if index.returncode != 0:
        raise WorkspaceRefused("workspace-not-a-repo", "git could not read the repository's index")
    if any(entry.startswith(GITLINK_MODE) for entry in index.stdout.split(b"\0")):
        raise _refuse_unsafe("the repository's index holds a submodule, and git status runs git inside it")


def _owner_of(path: Path) -> str:
    try:
        return str(os.stat(path).st_uid)
    except OSError:
        return "-"


def check_local_folder(folder: str, *, force: bool) -> LocalWorkspace:
    """The folder as a job's workspace (its real path, and the owner the job runs as), or WorkspaceRefused."""
    judged = folder_roots.judge(folder)
    if not judged.allowed:
        # The path and its owner stay in this host's log: whoever asked learns only the reason token.
        logger.warning("folder_not_allowed folder=%r owner=%s why=%s", str(judged.path), _owner_of(judged.path),
                       judged.why)
        raise WorkspaceRefused(FOLDER_NOT_ALLOWED, folder_roots.LOCAL.hint(judged.why))
    path = judged.path
    if not path.is_dir():
        raise WorkspaceRefused("workspace-missing", f"{path.name or folder} is not a folder on this host")
    stat = os.stat(path)
    owner = (stat.st_uid, stat.st_gid)
    if stat.st_uid == 0:
        raise WorkspaceRefused(
            "job-user-unmappable", "the folder belongs to root and jobs never run as root; chown it to its user"
        )
    if not os.path.lexists(path / ".git"):
        raise WorkspaceRefused("workspace-not-a-repo", "the folder is not the root of a git repository")
    try:
        _check_repository_safe(path, owner)
        # One call answers both questions: `# branch.oid (initial)` means no commit, other lines are changes.
        # Submodules were refused above; ignoring them is the second lock on status running git inside one.
        status = _git(path, owner, "status", "--porcelain=v2", "--branch", "--ignore-submodules=all")
    except (subprocess.TimeoutExpired, OSError):
        raise WorkspaceRefused("workspace-not-a-repo", "git did not answer about the folder in time") from None
    if status.returncode != 0:
        raise WorkspaceRefused("workspace-not-a-repo", "git status failed: the folder is not a usable repository")
    lines = status.stdout.decode(errors="replace").splitlines()
    if "# branch.oid (initial)" in lines:
        raise WorkspaceRefused("workspace-no-commit", "the repository has no commit yet")
    if any(not line.startswith("# ") for line in lines if line) and not force:
        raise WorkspaceRefused("workspace-dirty", "the folder has uncommitted changes; commit or stash them, or force")
    head = next((line.split()[2] for line in lines if line.startswith("# branch.oid ") and len(line.split()) == 3),
                "")
    return LocalWorkspace(folder=path, owner=owner, head=head)
