"""The worker's git on the repository the agent wrote runs nothing of it: a real job's workspace (cloned from the
stand-in forge as gate 10 clones it) that a hostile agent left behind, published by the worker's real publish step
(apps/worker/forges/publishing/). Each attack is refused with its reason, no command it names runs (its marker
file never appears), and nothing reaches the forge."""

import os
import subprocess

import pytest

from apps.worker.forges.publishing import kept
from apps.worker.forges.publishing import service as publishing
from apps.worker.sandbox import container, forge_workspace, jobfiles
from tests.jobspecs import forge_spec
from tests.receiver_support import basic, make_repository

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(tmp_path, forges, settings):
    """A GitHub job's folders and its fresh clone; the agent has fixed the README."""
    settings.PI_PUBLISH_RETRY_SECONDS = 0.01
    settings.PI_CLONE_TIMEOUT_SECONDS = 20  # a git left waiting (on a FIFO) fails the test in seconds, not minutes
    remote = tmp_path / "remote"
    forges.serve_git(remote, basic("x-access-token", "ghp-test"))
    forges.github_repository("acme/web", make_repository(remote, "acme/web", {"README.md": "hello\n"}))
    spec = forge_spec("gh-hostile", number=7)
    dirs = jobfiles.prepare(spec, tmp_path / "jobs", owner=container.job_user())
    workspace = forge_workspace.prepare(spec, dirs, owner=container.job_user())
    (dirs.workspace / "README.md").write_text("hello, fixed\n")
    return spec, dirs, workspace


def publish(job):
    spec, dirs, workspace = job
    publication, reason = publishing.publish_run(spec, workspace, dirs.root, dirs.workspace, "Fix it", 1_800_000_000)
    return publication.outcome, reason


def agent_git(workspace, *args, input=None) -> str:
    """git in the workspace as the agent runs it in its container."""
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(workspace), *args], input=input, check=True,
                          capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(workspace), "GIT_CONFIG_NOSYSTEM": "1",
                               "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@a", "GIT_COMMITTER_NAME": "a",
                               "GIT_COMMITTER_EMAIL": "a@a"}).stdout.strip()


def nothing_reached_the_forge(forges, tmp_path) -> bool:
    heads = subprocess.run(["git", "-C", str(tmp_path / "remote" / "acme/web.git"), "for-each-ref", "refs/heads"],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    return forges.pulls_of("github", "acme/web") == [] and [line.split()[-1] for line in heads if line] == [
        "refs/heads/main"]


def make_lazy(workspace, marker):
    """The agent's repository as a partial clone whose promisor remote is a command, and a commit that needs an
    object it lacks: git that fetched lazily would run the command to get it."""
    tree = agent_git(workspace, "mktree", "--missing", input=f"100644 blob {'1' * 40}\tghost\n")
    agent_git(workspace, "update-ref", "HEAD", agent_git(workspace, "commit-tree", tree, "-p", "HEAD", "-m", "ghost"))
    agent_git(workspace, "config", "core.repositoryformatversion", "1")
    agent_git(workspace, "config", "extensions.partialClone", "evil")
    agent_git(workspace, "config", "remote.evil.url", f"ext::sh -c touch% {marker}")
    agent_git(workspace, "config", "remote.evil.promisor", "true")
    agent_git(workspace, "config", "protocol.ext.allow", "always")


def test_a_partial_clone_whose_promisor_remote_is_a_command_is_refused_and_runs_nothing(job, forges, tmp_path):
    _, dirs, _ = job
    marker = tmp_path / "pwned-lazy"
    make_lazy(dirs.workspace, marker)

    assert publish(job) == ("work-config-unsafe", "work-config-unsafe")
    assert not marker.exists() and nothing_reached_the_forge(forges, tmp_path)

    # What the refusal stands in front of: the worker's fetch by a git that fetches lazily (before 2.39.4 /
    # 2.45.1, or with lazy fetching turned back on) runs the agent's command.
    store = tmp_path / "probe.git"
    subprocess.run(["git", "init", "-q", "--bare", str(store)], check=True)
    subprocess.run(["git", "--git-dir", str(store), "-c", "protocol.file.allow=always", "fetch",
                    "--upload-pack=git -c safe.directory=* upload-pack", "-q", str(dirs.workspace), "+HEAD:refs/x"],
                   capture_output=True, env={**os.environ, "GIT_NO_LAZY_FETCH": "0"})
    assert marker.exists()


@pytest.mark.parametrize("plant", ["extra-remote", "origin-moved", "fsmonitor", "include", "protocol", "url-rewrite"])
def test_a_config_that_points_git_elsewhere_is_refused(job, forges, tmp_path, plant):
    _, dirs, _ = job
    marker = tmp_path / f"pwned-{plant}"
    command = f"ext::sh -c touch% {marker}"
    settings_of = {
        "extra-remote": [("remote.upstream.url", command)],
        "origin-moved": [("remote.origin.url", command)],
        "fsmonitor": [("core.fsmonitor", f"touch {marker}; false")],
        "include": [("include.path", "../../evil.cfg")],
        "protocol": [("protocol.ext.allow", "always")],
        "url-rewrite": [(f"url.{command}.insteadOf", "https://")],
    }
    for key, value in settings_of[plant]:
        agent_git(dirs.workspace, "config", key, value)

    assert publish(job) == ("work-config-unsafe", "work-config-unsafe")
    assert not marker.exists() and nothing_reached_the_forge(forges, tmp_path)


@pytest.mark.parametrize("nested", ["gitfile", "folder"])
def test_another_repository_inside_the_workspace_is_refused_before_git_opens_it(job, forges, tmp_path, nested):
    """`vendor/lib/.git` naming a repository elsewhere on the host (whose config runs a command), or a
    repository made inside the work tree: `git add` would open either."""
    _, dirs, _ = job
    marker = tmp_path / "pwned-nested"
    elsewhere = tmp_path / "elsewhere"
    subprocess.run(["git", "init", "-q", str(elsewhere)], check=True)
    subprocess.run(["git", "-C", str(elsewhere), "config", "core.fsmonitor", f"touch {marker}; false"], check=True)
    library = dirs.workspace / "vendor" / "lib"
    library.mkdir(parents=True)
    (library / "lib.py").write_text("x = 1\n")
    if nested == "gitfile":
        (library / ".git").write_text(f"gitdir: {elsewhere / '.git'}\n")
    else:
        (library / ".git").mkdir()

    assert publish(job) == ("work-nested-repository", "work-nested-repository")
    assert not marker.exists() and nothing_reached_the_forge(forges, tmp_path)


def test_a_chain_of_links_that_leaves_the_workspace_is_refused(job, forges, tmp_path):
    """Each link alone stays inside (`sub/deep` is the workspace itself; `sub/deep/..` reads as `sub`), but
    followed, `up` is the workspace's parent: on this host (the job's folder) and in every checkout."""
    _, dirs, _ = job
    (dirs.workspace / "sub").mkdir()
    (dirs.workspace / "sub" / "deep").symlink_to("..")
    (dirs.workspace / "up").symlink_to("sub/deep/..")

    assert publish(job) == ("symlink-escapes", "symlink-escapes")
    assert nothing_reached_the_forge(forges, tmp_path)
    assert kept.is_kept(dirs.root)  # for the operator to look at


def test_links_that_stay_inside_are_published(job, forges, tmp_path):
    _, dirs, _ = job
    (dirs.workspace / "sub").mkdir()
    (dirs.workspace / "sub" / "deep").symlink_to("..")
    (dirs.workspace / "docs").mkdir()
    (dirs.workspace / "docs" / "readme").symlink_to("../sub/deep/README.md")

    assert publish(job) == ("published", "")
    assert [pull["head"] for pull in forges.pulls_of("github", "acme/web")] == ["pi/7-fix-bug"]


def test_a_fifo_in_the_agents_git_folder_is_refused_not_waited_on(job, forges, tmp_path):
    _, dirs, _ = job
    os.mkfifo(dirs.workspace / ".git" / "packed-refs")

    assert publish(job) == ("workspace-repo-unsafe", "workspace-repo-unsafe")
    assert nothing_reached_the_forge(forges, tmp_path)
