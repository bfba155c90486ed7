"""The agent's work, taken out of its workspace into a git directory of the worker's own.

The workspace (and its `.git`) was the agent's to write: git never runs there with its configuration. The
worker fetches the agent's commits from it into a fresh bare repository under the job's folder, commits what
the agent left uncommitted by reading the work tree with that repository's (empty) configuration, and writes
every commit again with the deployment's bot identity, so whatever the agent put in `user.name` or in its
commits' authors, what is published names the bot:

    work = collect(workspace, start_sha=..., store=job_root / "publish.git", identity=bot_identity())
    work.commits          # how many commits on top of the start
    work.head             # the commit to push (== start when there is nothing)
    work.changes          # every path the push would change, with its mode, blob and size
    bundle(work, path)    # the commits as a git bundle (their prerequisite: the start commit)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from apps.worker.sandbox.gitrun import run_git

UNCOMMITTED_MESSAGE = "Changes the agent left uncommitted"
AGENT_REF = "refs/pi/agent"
PUBLISHED_REF = "refs/pi/published"
SYMLINK_MODE, GITLINK_MODE = "120000", "160000"


class WorkUnreadable(Exception):
    """The workspace cannot be read safely or at all; `reason` is the record's token."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Identity:
    name: str
    email: str

    def environment(self, when: str = "") -> dict[str, str]:
        """Author and committer; `when` ("<unix seconds> +0000") fixes both dates, so the same work written again
        is the same commit (a retried publish then finds its branch as it left it)."""
        names = {"GIT_AUTHOR_NAME": self.name, "GIT_AUTHOR_EMAIL": self.email,
                 "GIT_COMMITTER_NAME": self.name, "GIT_COMMITTER_EMAIL": self.email}
        return {**names, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when} if when else names


def bot_identity() -> Identity:
    return Identity(settings.PI_GIT_AUTHOR_NAME, settings.PI_GIT_AUTHOR_EMAIL)


@dataclass(frozen=True)
class Change:
    path: str
    status: str  # A(dded), M(odified), D(eleted), T(ype changed)
    old_mode: str
    new_mode: str
    blob: str  # the new blob ("0" * 40 when deleted)
    size: int  # the new blob's size in bytes (0 when deleted)
    symlink_target: str = ""


@dataclass
class Work:
    store: Path
    start: str
    head: str
    commits: int
    changes: list[Change] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.commits == 0


def git(store: Path, *args: str, stdin: bytes | None = None, env: dict | None = None,
        authorization: str = "", check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
    """git on the worker's own repository (`--git-dir`), with the hardened runner; stdout as text."""
    try:
        result = run_git(store.parent, "--git-dir", str(store), *args, stdin=stdin, authorization=authorization,
                         timeout=timeout or settings.PI_CLONE_TIMEOUT_SECONDS, extra_env=env)
    except (subprocess.TimeoutExpired, OSError):
        raise WorkUnreadable("work-unreadable") from None
    if check and result.returncode != 0:
        raise WorkUnreadable("work-unreadable")
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode("utf-8", "replace"),
                                       result.stderr.decode("utf-8", "replace"))


def _check_agents_repository(workspace: Path) -> None:
    """Before git reads the agent's repository: a plain `.git` folder, no link inside it, no alternates or
    common directory (they would point git at other repositories on this host)."""
    dot_git = workspace / ".git"
    if dot_git.is_symlink() or not dot_git.is_dir():
        raise WorkUnreadable("workspace-repo-unsafe")
    for unsafe in ("commondir", "objects/info/alternates", "objects/info/http-alternates"):
        if os.path.lexists(dot_git / unsafe):
            raise WorkUnreadable("workspace-repo-unsafe")
    for root, folders, files in os.walk(dot_git):
        for name in folders + files:
            if os.path.islink(os.path.join(root, name)):
                raise WorkUnreadable("workspace-repo-unsafe")


def collect(workspace: Path, *, start_sha: str, store: Path, identity: Identity, finished_at: float) -> Work:
    """`finished_at` (when the agent's container ended) dates the commit of what it left uncommitted."""
    _check_agents_repository(workspace)
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(mode=0o700, parents=True)
    git(store, "init", "-q", "--bare")
    # The agent's HEAD, whatever it points at. A clone at depth 1 is shallow: its start commit is a root here too.
    if _fetch_workspace(store, workspace, f"+HEAD:{AGENT_REF}").returncode != 0:
        raise WorkUnreadable("work-unreadable")
    if git(store, "cat-file", "-e", f"{start_sha}^{{commit}}", check=False).returncode != 0:
        # The agent's HEAD does not build on the start: the start still is in the clone's own refs.
        _fetch_workspace(store, workspace, "+refs/*:refs/pi/workspace/*")
        if git(store, "cat-file", "-e", f"{start_sha}^{{commit}}", check=False).returncode != 0:
            raise WorkUnreadable("work-unreadable")
    agent_head = git(store, "rev-parse", AGENT_REF).stdout.strip()
    descends = git(store, "merge-base", "--is-ancestor", start_sha, agent_head, check=False).returncode == 0
    # Commits that do not build on the start (a rewritten history) are not taken; the work tree still is.
    commits = (git(store, "rev-list", "--reverse", "--topo-order", f"{start_sha}..{agent_head}").stdout.split()
               if descends else [])
    head = _rewrite(store, start_sha, commits, identity)
    head = _commit_work_tree(store, workspace, parent=head, identity=identity, when=f"{int(finished_at)} +0000")
    count = int(git(store, "rev-list", "--count", f"{start_sha}..{head}").stdout.strip() or 0)
    git(store, "update-ref", PUBLISHED_REF, head)
    return Work(store=store, start=start_sha, head=head, commits=count,
                changes=changes_between(store, start_sha, head) if count else [])


def _fetch_workspace(store: Path, workspace: Path, refspec: str) -> subprocess.CompletedProcess:
    """Fetch from the agent's clone, which belongs to the job's user. Its upload-pack is a process of its own,
    which git starts without our `-c` settings, so it is told to read a repository it does not own; it runs
    nothing the repository's own config names (its pack-objects hook is read only from the system and global
    config, which run_git leaves empty)."""
    return git(store, "-c", "protocol.file.allow=always", "fetch", "--upload-pack=git -c safe.directory=* upload-pack",
               "-q", "--no-tags", "--update-shallow", str(workspace), refspec, check=False)


def _rewrite(store: Path, start: str, commits: list[str], identity: Identity) -> str:
    """The agent's commits again, same trees, messages, dates and shape, with the bot as author and committer."""
    mapped = {start: start}
    head = start
    for commit in commits:
        tree = git(store, "rev-parse", f"{commit}^{{tree}}").stdout.strip()
        parents = git(store, "rev-list", "--parents", "-n", "1", commit).stdout.split()[1:]
        if any(parent not in mapped for parent in parents):
            raise WorkUnreadable("work-unreadable")  # history from outside the clone: nothing of it is published
        message = git(store, "log", "-1", "--format=%B", commit).stdout
        when = git(store, "log", "-1", "--format=%at +0000", commit).stdout.strip()
        arguments = [argument for parent in parents for argument in ("-p", mapped[parent])]
        head = mapped[commit] = git(store, "commit-tree", tree, *arguments, stdin=message.encode(),
                                    env=identity.environment(when)).stdout.strip()
    return head


def _commit_work_tree(store: Path, workspace: Path, *, parent: str, identity: Identity, when: str) -> str:
    """What the work tree holds beyond `parent`, as one commit; `parent` itself when it holds nothing more.
    The index lives in the worker's repository and git reads the tree with that repository's configuration."""
    index = store / "pi-index"
    env = {"GIT_INDEX_FILE": str(index)}
    git(store, "read-tree", parent, env=env)
    git(store, "--work-tree", str(workspace), "add", "-A", env=env, timeout=settings.PI_CLONE_TIMEOUT_SECONDS)
    tree = git(store, "write-tree", env=env).stdout.strip()
    index.unlink(missing_ok=True)
    if tree == git(store, "rev-parse", f"{parent}^{{tree}}").stdout.strip():
        return parent
    return git(store, "commit-tree", tree, "-p", parent, stdin=f"{UNCOMMITTED_MESSAGE}\n".encode(),
               env=identity.environment(when)).stdout.strip()


def changes_between(store: Path, start: str, head: str) -> list[Change]:
    raw = git(store, "diff-tree", "-r", "-z", "--no-renames", "--raw", start, head).stdout
    fields = raw.split("\0")
    entries = []
    for index in range(0, len(fields) - 1, 2):
        meta, path = fields[index], fields[index + 1]
        if not meta.startswith(":"):
            continue
        old_mode, new_mode, _, blob, status = meta[1:].split(" ")
        entries.append((path, status[0], old_mode, new_mode, blob))
    live = [blob for _, status, _, mode, blob in entries if status != "D" and mode != GITLINK_MODE]
    sizes = {}
    if live:
        for line in git(store, "cat-file", "--batch-check=%(objectname) %(objectsize)",
                        stdin="\n".join(live).encode() + b"\n").stdout.splitlines():
            name, _, size = line.partition(" ")
            sizes[name] = int(size) if size.isdigit() else 0
    changes = []
    for path, status, old_mode, new_mode, blob in entries:
        target = ""
        if new_mode == SYMLINK_MODE:
            target = git(store, "cat-file", "blob", blob).stdout
        changes.append(Change(path=path, status=status, old_mode=old_mode, new_mode=new_mode, blob=blob,
                              size=sizes.get(blob, 0), symlink_target=target))
    return changes


def bundle(work: Work, path: Path) -> None:
    """The published commits as a bundle whose one prerequisite is the start commit (on the forge already)."""
    git(work.store, "bundle", "create", str(path), f"{work.start}..{PUBLISHED_REF}")
    path.chmod(0o600)
