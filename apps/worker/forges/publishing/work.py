"""The agent's work, taken out of its workspace into a git directory of the worker's own.

The workspace (and its `.git`) was the agent's to write: git never runs there with its configuration. The
worker fetches the agent's commits from it into a fresh bare repository under the job's folder, commits what
the agent left uncommitted by reading the work tree with that repository's (empty) configuration, and writes
every commit again with the deployment's bot identity, so whatever the agent put in `user.name` or in its
commits' authors, what is published names the bot:

    work = collect(workspace, start_sha=..., store=job_root / "publish.git", identity=bot_identity(),
                   origin_url=clone_url, finished_at=...)
    work.commits          # how many commits on top of the start
    work.head             # the commit to push (== start when there is nothing)
    work.changes          # every path the push would change, with its mode, blob and size
    work.links            # when a change is a link: every link of the tree after (`start_links`: before)
    bundle(work, path)    # the commits as a git bundle (their prerequisite: the start commit)

Before git reads anything of it, the workspace is refused when it could point git elsewhere: links or odd files
in its `.git`, alternates or a common directory (`workspace-repo-unsafe`); a config that could make the fetch's
upload-pack, which reads it, run a program or reach another place (`work-config-unsafe`); another repository
inside the work tree, which `git add` would open (`work-nested-repository`). Links in the work tree are never
followed on this host (git records them as links); where they lead is checks.py's question.

What the agent's history may cost is bounded before git expands any of it (`work-too-large`): its commits and
what each commit's tree holds, counted from the object headers (measure.py); every git process of the collection
runs with a heap of PI_PUBLISH_GIT_MEMORY_MB, and all of them within PI_PUBLISH_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from apps.worker.forges.publishing import measure
from apps.worker.sandbox.gitrun import git_command, run_git, unsafe_settings

UNCOMMITTED_MESSAGE = "Changes the agent left uncommitted"
AGENT_REF = "refs/pi/agent"
PUBLISHED_REF = "refs/pi/published"
SYMLINK_MODE, GITLINK_MODE = "120000", "160000"
# The remote the worker's clone wrote (forge_workspace.clone_at: `git remote add origin <clone url>`).
ORIGIN_FETCH = "+refs/heads/*:refs/remotes/origin/*"
# What in the agent's config the fetch's upload-pack would act on, or be sent elsewhere by: another file or tree
# to read, a repository extension (a partial clone's lazy fetch), a protocol it allows, a URL it rewrites, a
# program it runs. Filters are not among them: git reads the work tree with the worker's config, never the agent's.
AGENT_CONFIG_UNSAFE = re.compile(r"include\..+|includeif\..+|core\.worktree|extensions\..+|remote\..+\.promisor"
                                 r"|core\.fsmonitor|protocol\..+|url\..+|core\.sshcommand|core\.gitproxy"
                                 r"|core\.alternaterefscommand")


TOO_LARGE = "work-too-large"
# When the collection of one job's work must end (time.monotonic()): set by `collect` for every git call it makes,
# however deep (the helpers below are shared with the publish checks and "Publish again", which set none).
_deadline: ContextVar[float | None] = ContextVar("publishing_deadline", default=None)


class WorkUnreadable(Exception):
    """The workspace cannot be read safely or at all; `reason` is the record's token, `detail` what the run page
    says of it (a bound and the amount found: numbers and setting names only)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _out_of_time() -> WorkUnreadable:
    return WorkUnreadable(TOO_LARGE, f"reading the agent's work took longer than "
                                     f"{settings.PI_PUBLISH_TIMEOUT_SECONDS} s (PI_PUBLISH_TIMEOUT_SECONDS)")


def _time_left(timeout: float) -> float:
    deadline = _deadline.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise _out_of_time()
    return min(timeout, left)


@contextlib.contextmanager
def _within_publishing_bounds():
    token = _deadline.set(time.monotonic() + settings.PI_PUBLISH_TIMEOUT_SECONDS)
    try:
        yield
    finally:
        _deadline.reset(token)


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


@dataclass
class Work:
    store: Path
    start: str
    head: str
    commits: int
    changes: list[Change] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # path -> target, at `head` (when a change is a link)
    start_links: dict[str, str] = field(default_factory=dict)  # the same at `start`

    @property
    def empty(self) -> bool:
        return self.commits == 0


def git(store: Path, *args: str, stdin: bytes | None = None, env: dict | None = None, authorization: str = "",
        transport: str = "none", check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
    """git on the worker's own repository (`--git-dir`), with the hardened runner and its heap bounded; stdout as
    text."""
    try:
        result = run_git(store.parent, "--git-dir", str(store), *args, stdin=stdin, authorization=authorization,
                         transport=transport, timeout=_time_left(timeout or settings.PI_CLONE_TIMEOUT_SECONDS),
                         extra_env=env, memory_mb=settings.PI_PUBLISH_GIT_MEMORY_MB)
    except subprocess.TimeoutExpired:
        raise (_out_of_time() if _deadline.get() is not None and _deadline.get() <= time.monotonic()
               else WorkUnreadable("work-unreadable")) from None
    except OSError:
        raise WorkUnreadable("work-unreadable") from None
    if check and result.returncode != 0:
        raise WorkUnreadable("work-unreadable")
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode("utf-8", "replace"),
                                       result.stderr.decode("utf-8", "replace"))


def _check_agents_repository(workspace: Path) -> None:
    """Before git reads the agent's repository: a plain `.git` folder of plain files (a link would point git
    elsewhere, a FIFO would hold it), no alternates or common directory (other repositories on this host)."""
    dot_git = workspace / ".git"
    if dot_git.is_symlink() or not dot_git.is_dir():
        raise WorkUnreadable("workspace-repo-unsafe")
    for unsafe in ("commondir", "objects/info/alternates", "objects/info/http-alternates"):
        if os.path.lexists(dot_git / unsafe):
            raise WorkUnreadable("workspace-repo-unsafe")
    for root, folders, files in os.walk(dot_git):
        for name in folders + files:
            mode = os.lstat(os.path.join(root, name)).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise WorkUnreadable("workspace-repo-unsafe")


def _check_agents_config(store: Path, workspace: Path, origin_url: str) -> None:
    """The agent's `.git/config` is read by the upload-pack of the fetch below, a process of its own that the
    runner's `-c` settings do not reach: it may set nothing that runs a program, reads another file, fetches
    lazily or reaches elsewhere, and no remote but the `origin` the worker's clone wrote. Read by git's own
    parser (no includes followed), so what is checked is what upload-pack would read."""
    listing = git(store, "config", "--file", str(workspace / ".git" / "config"), "--list", "-z", check=False)
    if listing.returncode != 0:
        raise WorkUnreadable("work-unreadable")
    ours = {("remote.origin.url", origin_url), ("remote.origin.fetch", ORIGIN_FETCH)}
    entries = []
    for entry in filter(None, listing.stdout.split("\0")):
        key, has_value, value = entry.partition("\n")
        entries.append((key, value if has_value else None))
    lowered = [(".git/config", key.lower(), value) for key, value in entries]
    if unsafe_settings(lowered, AGENT_CONFIG_UNSAFE) or any(
            key.lower().startswith("remote.") and (key, value) not in ours for key, value in entries):
        raise WorkUnreadable("work-config-unsafe")


def _check_no_nested_repository(workspace: Path) -> None:
    """Before git reads the work tree: no other repository inside it, a `.git` folder or a `.git` file naming one
    anywhere on this host, which `git add` would open (as a submodule) to read its HEAD."""
    def unreadable(error: OSError):
        raise WorkUnreadable("work-unreadable")

    for root, folders, files in os.walk(workspace, onerror=unreadable):
        at_top = root == os.fspath(workspace)
        if any(name.lower() == ".git" and not (at_top and name == ".git") for name in folders + files):
            raise WorkUnreadable("work-nested-repository")
        if at_top:
            folders[:] = [name for name in folders if name != ".git"]  # the agent's repository: checked above


def collect(workspace: Path, *, start_sha: str, store: Path, identity: Identity, origin_url: str,
            finished_at: float, message: str = UNCOMMITTED_MESSAGE + "\n") -> Work:
    """`origin_url` is the clone's own remote (the one `remote.*` its config may hold); `finished_at` (when the
    agent's container ended) dates the commit of what it left uncommitted, and `message` is that commit's
    message (messages.commit_message: forge text, for the forge only)."""
    with _within_publishing_bounds():
        return _collect(workspace, start_sha=start_sha, store=store, identity=identity, origin_url=origin_url,
                        finished_at=finished_at, message=message)


def _collect(workspace: Path, *, start_sha: str, store: Path, identity: Identity, origin_url: str,
             finished_at: float, message: str) -> Work:
    _check_agents_repository(workspace)
    _check_no_nested_repository(workspace)
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(mode=0o700, parents=True)
    git(store, "init", "-q", "--bare")
    _check_agents_config(store, workspace, origin_url)
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
    commits = _measured_commits(store, start_sha, agent_head) if descends else []
    head = _rewrite(store, start_sha, commits, identity)
    head = _commit_work_tree(store, workspace, parent=head, identity=identity, when=f"{int(finished_at)} +0000",
                             message=message)
    count = int(git(store, "rev-list", "--count", f"{start_sha}..{head}").stdout.strip() or 0)
    git(store, "update-ref", PUBLISHED_REF, head)
    return work_between(store, start_sha, head, count)


def _measured_commits(store: Path, start: str, agent_head: str) -> list[str]:
    """The agent's commits above the start, oldest first, once they are known to be within the bounds: their count
    first (commits only), then what each one's tree holds (measure.py), before anything expands them."""
    bounds = measure.Bounds.from_settings()
    count = int(git(store, "rev-list", "--count", f"{start}..{agent_head}").stdout.strip() or 0)
    if count > bounds.commits:
        raise WorkUnreadable(TOO_LARGE, measure.Measured(count, 0, 0, 0, 0).too_large(bounds))
    listing = git(store, "rev-list", "--reverse", "--topo-order", "--format=%T", f"{start}..{agent_head}").stdout
    lines = listing.split()  # "commit", <commit>, <tree> for each
    commits, trees = lines[1::3], lines[2::3]
    start_tree = git(store, "rev-parse", f"{start}^{{tree}}").stdout.strip()
    command, environment = git_command(store.parent, "--git-dir", str(store),
                                       memory_mb=settings.PI_PUBLISH_GIT_MEMORY_MB)
    try:
        measure.measure(command, environment, start_tree, trees, bounds, _time_left(settings.PI_CLONE_TIMEOUT_SECONDS))
    except measure.TooLarge as too_large:
        raise WorkUnreadable(TOO_LARGE, str(too_large)) from None
    except measure.OutOfTime:
        raise _out_of_time() from None
    except (OSError, ValueError, subprocess.SubprocessError):
        raise WorkUnreadable("work-unreadable") from None
    return commits


def work_between(store: Path, start: str, head: str, commits: int) -> Work:
    """The work from `start` to `head` in `store`: its changes and, when one of them is a link, every link of
    both trees (where a link leads depends on the others)."""
    changes = changes_between(store, start, head) if commits else []
    if not any(SYMLINK_MODE in (change.old_mode, change.new_mode) for change in changes):
        return Work(store=store, start=start, head=head, commits=commits, changes=changes)
    return Work(store=store, start=start, head=head, commits=commits, changes=changes,
                links=links_in(store, head), start_links=links_in(store, start))


def _fetch_workspace(store: Path, workspace: Path, refspec: str) -> subprocess.CompletedProcess:
    """Fetch from the agent's clone, which belongs to the job's user. Its upload-pack is a process of its own,
    which git starts without our `-c` settings, so it is told to read a repository it does not own; it runs
    nothing the repository's own config names (checked above; its pack-objects hook is read only from the
    system and global config, which run_git leaves empty) and fetches nothing lazily (GIT_NO_LAZY_FETCH)."""
    return git(store, "fetch", "--upload-pack=git -c safe.directory=* upload-pack", "-q", "--no-tags",
               "--update-shallow", str(workspace), refspec, transport="file", check=False)


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


def _commit_work_tree(store: Path, workspace: Path, *, parent: str, identity: Identity, when: str,
                      message: str) -> str:
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
    return git(store, "commit-tree", tree, "-p", parent, stdin=message.encode(),
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
    return [Change(path=path, status=status, old_mode=old_mode, new_mode=new_mode, blob=blob, size=sizes.get(blob, 0))
            for path, status, old_mode, new_mode, blob in entries]


def links_in(store: Path, commit: str) -> dict[str, str]:
    """Every link in `commit`'s tree, path -> target (one `ls-tree` and one `cat-file --batch`)."""
    listing = git(store, "ls-tree", "-r", "-z", "--full-tree", commit).stdout
    blobs = {}
    for entry in filter(None, listing.split("\0")):
        meta, _, path = entry.partition("\t")
        mode, _, blob = meta.split(" ")
        if mode == SYMLINK_MODE:
            blobs[path] = blob
    if not blobs:
        return {}
    unique = list(dict.fromkeys(blobs.values()))
    try:
        result = run_git(store.parent, "--git-dir", str(store), "cat-file", "--batch",
                         stdin="\n".join(unique).encode() + b"\n", timeout=settings.PI_CLONE_TIMEOUT_SECONDS)
    except (subprocess.TimeoutExpired, OSError):
        raise WorkUnreadable("work-unreadable") from None
    if result.returncode != 0:
        raise WorkUnreadable("work-unreadable")
    output, position, targets = result.stdout, 0, {}
    for blob in unique:
        header_end = output.find(b"\n", position)
        header = output[position:header_end].split()
        if header_end < 0 or len(header) != 3:  # "<oid> missing"
            raise WorkUnreadable("work-unreadable")
        start = header_end + 1
        targets[blob] = output[start:start + int(header[2])].decode("utf-8", "replace")
        position = start + int(header[2]) + 1
    return {path: targets[blob] for path, blob in blobs.items()}


def bundle(work: Work, path: Path) -> None:
    """The published commits as a bundle whose one prerequisite is the start commit (on the forge already)."""
    git(work.store, "bundle", "create", str(path), f"{work.start}..{PUBLISHED_REF}")
    path.chmod(0o600)
