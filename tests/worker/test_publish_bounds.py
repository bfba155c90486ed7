"""What the agent's history may cost the worker is bounded before git expands it (issue 53 §1): a few hundred
kilobytes of `.git` naming ten million paths, or gigabytes of one blob listed again and again, or thousands of
commits, are refused `work-too-large` from their object headers, with the bound on the run page; every git process
of the collection runs with a bounded heap, and all of them within PI_PUBLISH_TIMEOUT_SECONDS. Real repositories,
real git."""

import subprocess
import time

import pytest

from apps.worker.forges.publishing.work import WorkUnreadable
from tests.worker.test_publish_work import FILES, clone_of, gather, run

MODE_FILE, MODE_TREE = "100644", "040000"


def git_in(workspace, *args, stdin: str = "") -> str:
    return subprocess.run(["git", "-C", str(workspace), *args], input=stdin, check=True, capture_output=True,
                          text=True).stdout.strip()


def tree_bomb(workspace, levels: int, fanout: int = 10) -> str:
    """A tree naming fanout**levels paths, in `levels` + 1 tree objects."""
    blob = git_in(workspace, "hash-object", "-w", "--stdin", stdin="boom\n")
    tree = git_in(workspace, "mktree", stdin="".join(f"{MODE_FILE} blob {blob}\tf{n}\n" for n in range(fanout)))
    for _ in range(levels - 1):
        tree = git_in(workspace, "mktree", stdin="".join(f"{MODE_TREE} tree {tree}\td{n}\n" for n in range(fanout)))
    return tree


def commit_with(workspace, extra: dict[str, tuple[str, str]], message="work") -> str:
    """A commit on HEAD whose tree is HEAD's plus `extra` (name -> (mode, object)), made HEAD."""
    listing = git_in(workspace, "ls-tree", "HEAD")
    entries = listing + "\n" + "".join(f"{mode} {'tree' if mode == MODE_TREE else 'blob'} {oid}\t{name}\n"
                                       for name, (mode, oid) in extra.items())
    tree = git_in(workspace, "mktree", stdin=entries)
    commit = git_in(workspace, "commit-tree", tree, "-p", "HEAD", "-m", message)
    git_in(workspace, "update-ref", "HEAD", commit)
    return commit


def many_commits(workspace, count: int) -> None:
    """`count` small commits on HEAD in one fast-import."""
    branch = git_in(workspace, "symbolic-ref", "HEAD")
    stream = [f"reset {branch}", f"from {git_in(workspace, 'rev-parse', 'HEAD')}", ""]
    for n in range(count):
        message = f"c{n:06d}"
        stream += [f"commit {branch}", f"committer Agent <agent@example.invalid> {1_700_000_000 + n} +0000",
                   f"data {len(message)}", message, f"M 100644 inline n{n}", "data 1", "x", ""]
    git_in(workspace, "fast-import", "--quiet", stdin="\n".join(stream) + "\n")
    git_in(workspace, "reset", "-q", "--hard")


def refused(tmp_path, workspace, sha) -> WorkUnreadable:
    with pytest.raises(WorkUnreadable) as caught:
        gather(tmp_path, workspace, sha)
    return caught.value


def test_a_tree_naming_ten_million_paths_is_refused_from_its_headers_without_an_index(tmp_path):
    workspace, sha = clone_of(tmp_path, FILES)
    commit_with(workspace, {"bomb": (MODE_TREE, tree_bomb(workspace, levels=7))})
    dot_git_kb = int(subprocess.run(["du", "-sk", str(workspace / ".git")], capture_output=True, text=True,
                                    check=True).stdout.split()[0])
    assert dot_git_kb < 1024  # the whole attack is a few hundred kilobytes

    started = time.monotonic()
    error = refused(tmp_path, workspace, sha)

    assert error.reason == "work-too-large"
    assert error.detail == ("a commit adds 10,000,000 paths to the start's 2 (at most 300: PI_MAX_CHANGED_FILES)")
    assert time.monotonic() - started < 30  # counted, not expanded (expanding it took 325 s)
    store = tmp_path / "job" / "publish.git"
    assert not (store / "pi-index").exists() and not (store / "index").exists()


def test_an_intermediate_commit_carrying_gigabytes_of_one_blob_is_refused_though_the_last_removes_it(tmp_path):
    workspace, sha = clone_of(tmp_path, FILES)
    blob = git_in(workspace, "hash-object", "-w", str(_file(tmp_path / "big", 20 * 1024 * 1024)))
    tree = git_in(workspace, "mktree", stdin="".join(f"{MODE_FILE} blob {blob}\tcopy{n}\n" for n in range(100)))
    commit_with(workspace, {"copies": (MODE_TREE, tree)}, "add")
    git_in(workspace, "reset", "-q", "--hard")
    git_in(workspace, "rm", "-rq", "copies")
    git_in(workspace, "-c", "user.name=A", "-c", "user.email=a@example.invalid", "commit", "-qm", "remove")

    error = refused(tmp_path, workspace, sha)

    assert error.reason == "work-too-large"
    assert error.detail.startswith("a commit's files add up to 2,097,152,000 bytes beyond the start's (at most "
                                   "52,428,800: PI_MAX_PUSH_BYTES)")


def test_more_commits_than_the_bound_are_refused_before_one_is_rewritten(tmp_path, settings):
    workspace, sha = clone_of(tmp_path, FILES)
    many_commits(workspace, 101)

    error = refused(tmp_path, workspace, sha)

    assert (error.reason, error.detail) == ("work-too-large", "101 commits (at most 100: PI_PUBLISH_MAX_COMMITS)")
    store = tmp_path / "job" / "publish.git"
    assert run(tmp_path, "--git-dir", str(store), "rev-list", "--all", "--author=pidispatch", "--count") == "0"

    settings.PI_PUBLISH_MAX_COMMITS = 101
    assert gather(tmp_path, workspace, sha).commits == 101


def test_the_whole_collection_ends_at_its_deadline(tmp_path, settings):
    """Thousands of commits under a raised commit bound: rewriting them took 39 s; the deadline stops it."""
    settings.PI_PUBLISH_MAX_COMMITS = 10_000
    settings.PI_PUBLISH_TIMEOUT_SECONDS = 1
    workspace, sha = clone_of(tmp_path, FILES)
    many_commits(workspace, 2000)

    started = time.monotonic()
    error = refused(tmp_path, workspace, sha)

    assert (error.reason, error.detail) == (
        "work-too-large", "reading the agent's work took longer than 1 s (PI_PUBLISH_TIMEOUT_SECONDS)")
    assert time.monotonic() - started < 10


def test_a_git_process_of_the_collection_cannot_take_more_than_its_heap(tmp_path, settings):
    """Past the header bounds (raised here), the index git would build for a million paths needs far more than
    the heap it is given: the process fails at once, the work is not read, and the host keeps its memory (with no
    heap bound, the same reading ran into the two-minute deadline here)."""
    settings.PI_MAX_CHANGED_FILES = 10**8
    settings.PI_PUBLISH_GIT_MEMORY_MB = 48
    workspace, sha = clone_of(tmp_path, FILES)
    commit_with(workspace, {"bomb": (MODE_TREE, tree_bomb(workspace, levels=6))})

    started = time.monotonic()
    assert refused(tmp_path, workspace, sha).reason == "work-unreadable"
    assert time.monotonic() - started < 30


def _file(path, size: int):
    with open(path, "wb") as out:
        out.truncate(size)
    return path


def test_a_host_without_prlimit_is_told_its_git_heap_is_not_bounded(settings, monkeypatch):
    from django.core.checks import run_checks

    from apps.worker.sandbox import gitrun

    monkeypatch.setattr(gitrun, "PRLIMIT", None)
    assert [message.id for message in run_checks() if message.id == "worker.W006"] == ["worker.W006"]
    settings.PI_PUBLISH_GIT_MEMORY_MB = 0
    assert not [message for message in run_checks() if message.id == "worker.W006"]
