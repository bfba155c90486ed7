"""A forge job's workspace (apps/worker/sandbox/forge_workspace.py): the default branch and its protection through
each forge's API, a shallow clone at exactly that commit from a real git remote (git http-backend, the token
checked by the server), the repo's .pi/ within bounds, and forge errors as retry or refusal."""

import os
import subprocess
from pathlib import Path

import pytest

from apps.worker.forges import ForgeFailure, RepoRef, forge_client
from apps.worker.sandbox import container, forge_workspace, jobfiles, repo_skills
from apps.worker.sandbox.workspace import WorkspaceRefused
from tests.jobspecs import forge_spec
from tests.receiver_support import FakeForge, basic, commit_files, make_repository, prune_unreachable

AZURE_PROJECT = "068d2409-14eb-4d8a-88bf-c8a9e7f5b4e2"
AZURE_REPOSITORY = "3411ebc1-d5aa-464f-9615-0b527bc66719"
FILES = {"README.md": "hello\n", "src/app.py": "print('hi')\n", ".pi/skills/fix-bug/SKILL.md": "# fix\n",
         ".pi/APPEND_SYSTEM.md": "Be brief.\n"}


@pytest.fixture
def remote(tmp_path, forges):
    """A bare repo `acme/web` on the fake forge's git endpoint, answering only GitHub's git credential."""
    root = tmp_path / "remote"
    forges.serve_git(root, basic("x-access-token", "ghp-test"))
    return root


def job_dirs(tmp_path, spec):
    return jobfiles.prepare(spec, tmp_path / "jobs", owner=container.job_user())


def head_of(folder: Path) -> str:
    return subprocess.run(["git", "-c", f"safe.directory={folder}", "-C", str(folder), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()


def prepare(tmp_path, spec):
    dirs = job_dirs(tmp_path, spec)
    return dirs, forge_workspace.prepare(spec, dirs, owner=container.job_user())


# --- GitHub, end to end in process ---------------------------------------------------------------------------

def test_github_clone_is_the_default_branch_at_the_resolved_commit(tmp_path, forges, remote):
    sha = make_repository(remote, "acme/web", FILES)
    forges.github_repository("acme/web", sha)

    dirs, workspace = prepare(tmp_path, forge_spec("gh-clone"))

    assert head_of(dirs.workspace) == sha == workspace.head.sha
    assert (dirs.workspace / "src" / "app.py").read_text() == "print('hi')\n"
    assert workspace.start_sha == sha and workspace.credential.token == "ghp-test"  # the worker's, not the agent's
    # The token was sent as a header only: the clone's config has the plain URL and nothing else of it.
    config = (dirs.workspace / ".git" / "config").read_text()
    assert f"url = {forges.url}/git/acme/web.git" in config and "ghp-test" not in config
    git_requests = [r for r in forges.requests if r["path"].startswith("/git/")]
    assert git_requests and all(r["headers"]["authorization"] == basic("x-access-token", "ghp-test")
                                for r in git_requests)
    # The clone is shallow, detached, and belongs to the container's user.
    assert (dirs.workspace / ".git" / "shallow").exists()
    status = subprocess.run(["git", "--no-optional-locks", "-c", f"safe.directory={dirs.workspace}", "-C",
                             str(dirs.workspace), "status"], capture_output=True, text=True).stdout
    assert "HEAD detached at" in status
    owner = container.job_user()
    assert all(os.lstat(path).st_uid == owner[0] for path in [dirs.workspace, *dirs.workspace.rglob("*")])


def test_github_asks_for_repository_and_branch_with_the_jobs_token(tmp_path, forges, remote):
    sha = make_repository(remote, "acme/web", FILES, branch="trunk")
    forges.github_repository("acme/web", sha, branch="trunk")

    dirs, workspace = prepare(tmp_path, forge_spec("gh-trunk"))

    assert workspace.head.name == "trunk" and head_of(dirs.workspace) == sha
    api = [r for r in forges.requests if not r["path"].startswith("/git/")]
    # A protected branch needs no ruleset lookup; the deployment's fork (where the work goes) is made before the
    # agent runs.
    assert [r["path"] for r in api] == ["/repos/acme/web", "/repos/acme/web/branches/trunk", "/repos/acme/web/forks",
                                        "/repos/pidispatch-bot/web"]
    assert all(r["headers"]["authorization"] == "Bearer ghp-test" for r in api)


@pytest.mark.parametrize("rules, protected", [((), False), (("deletion", "non_fast_forward"), False),
                                              (("pull_request",), True), (("update",), True)])
def test_github_rulesets_protect_a_branch_the_classic_flag_calls_unprotected(forges, rules, protected):
    forges.github_repository("acme/web", "a" * 40, protected=False, rules=rules)
    client = forge_client("github")
    head = client.default_branch(RepoRef("acme/web"), client.job_credential(RepoRef("acme/web")))
    assert head.protected is protected


def test_unprotected_default_branch_is_refused_before_any_clone(tmp_path, forges, remote):
    sha = make_repository(remote, "acme/web", FILES)
    forges.github_repository("acme/web", sha, protected=False)

    with pytest.raises(ForgeFailure) as refused:
        prepare(tmp_path, forge_spec("gh-unprotected"))

    assert (refused.value.reason, refused.value.transient) == ("unprotected-branch", False)
    assert not any(r["path"].startswith("/git/") for r in forges.requests)


def test_a_commit_force_pushed_away_between_resolve_and_clone_is_sha_gone(tmp_path, forges, remote):
    resolved = make_repository(remote, "acme/web", FILES)
    forges.github_repository("acme/web", resolved)
    commit_files(remote / "acme/web.git", {"README.md": "rewritten history\n"})
    prune_unreachable(remote / "acme/web.git")  # the resolved commit is gone for good

    with pytest.raises(ForgeFailure) as refused:
        prepare(tmp_path, forge_spec("gh-gone"))

    assert (refused.value.reason, refused.value.transient) == ("sha-gone", False)


def test_a_commit_just_behind_a_moved_tip_is_still_cloned_exactly(tmp_path, forges, remote):
    bare_sha = make_repository(remote, "acme/web", FILES)
    forges.github_repository("acme/web", bare_sha)
    # The branch moves on (a normal push) after the API answered: the clone is still the resolved commit.
    work = tmp_path / "pusher"
    subprocess.run(["git", "clone", "-q", str(remote / "acme/web.git"), str(work)], check=True)
    (work / "NEW.md").write_text("later\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e"}
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "later"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "push", "-q", "origin", "main"], check=True)

    dirs, _ = prepare(tmp_path, forge_spec("gh-moved"))

    assert head_of(dirs.workspace) == bare_sha and not (dirs.workspace / "NEW.md").exists()


def test_the_git_server_refusing_the_token_is_a_configuration_refusal(tmp_path, forges, remote):
    sha = make_repository(remote, "acme/web", FILES)
    forges.github_repository("acme/web", sha)
    forges.git_authorization = basic("x-access-token", "some-other-token")

    with pytest.raises(ForgeFailure) as refused:
        prepare(tmp_path, forge_spec("gh-git-401"))

    assert (refused.value.reason, refused.value.transient) == ("forge-auth-refused", False)


def test_a_clone_url_on_another_host_is_refused_so_the_token_never_goes_there(tmp_path, forges, remote):
    sha = make_repository(remote, "acme/web", FILES)
    forges.github_repository("acme/web", sha, clone_url="https://evil.example.com/acme/web.git")

    with pytest.raises(ForgeFailure) as refused:
        prepare(tmp_path, forge_spec("gh-elsewhere"))

    assert refused.value.reason == "forge-clone-url-refused" and not refused.value.transient


def test_git_never_follows_a_redirect_with_the_token(tmp_path, forges):
    elsewhere = FakeForge()
    try:
        forges.github_repository("acme/web", "d" * 40)
        forges.routes["/git/acme/web.git/info/refs"] = (
            302, {}, {"Location": f"{elsewhere.url}/git/acme/web.git/info/refs?service=git-upload-pack"})

        with pytest.raises(ForgeFailure):
            prepare(tmp_path, forge_spec("gh-redirect"))

        assert elsewhere.requests == []
        assert any(r["path"] == "/git/acme/web.git/info/refs" for r in forges.requests)
    finally:
        elsewhere.close()


def test_api_clone_url_rules():
    client = forge_client("github")
    client.base_url = "https://api.github.com"
    assert client.own_clone_url("https://github.com/acme/web.git") == "https://github.com/acme/web.git"
    client.base_url = "https://dev.azure.com/fabrikam"
    assert (client.own_clone_url("https://fabrikam@dev.azure.com/fabrikam/P/_git/r")
            == "https://dev.azure.com/fabrikam/P/_git/r")
    for elsewhere in ("https://github.com.evil.io/x.git", "http://dev.azure.com/fabrikam/P/_git/r",
                      "file:///etc/passwd", "ext::sh -c touch% /tmp/pwned"):
        with pytest.raises(ForgeFailure):
            client.own_clone_url(elsewhere)


@pytest.mark.parametrize("status, headers, reason, transient", [
    (500, {}, "forge-unavailable", True),
    (502, {}, "forge-unavailable", True),
    (429, {"Retry-After": "30"}, "forge-rate-limited", True),
    (403, {"X-RateLimit-Remaining": "0"}, "forge-rate-limited", True),
    (401, {}, "forge-auth-refused", False),
    (403, {}, "forge-auth-refused", False),
    (404, {}, "forge-repo-not-found", False),
    (422, {}, "forge-request-refused", False),
])
def test_forge_answers_become_retry_or_refusal(forges, status, headers, reason, transient):
    forges.routes["/repos/acme/web"] = (status, {"message": "nope"}, headers)
    client = forge_client("github")

    with pytest.raises(ForgeFailure) as failed:
        client.default_branch(RepoRef("acme/web"), client.job_credential(RepoRef("acme/web")))

    assert (failed.value.reason, failed.value.transient) == (reason, transient)


def test_an_unreachable_forge_is_transient_and_a_redirect_is_not(forges, settings):
    client = forge_client("github")
    forges.routes["/repos/acme/web"] = (301, {}, {"Location": "http://example.com/repos/acme/web2"})
    with pytest.raises(ForgeFailure) as moved:
        client.default_branch(RepoRef("acme/web"), client.job_credential(RepoRef("acme/web")))
    assert (moved.value.reason, moved.value.transient) == ("forge-redirect-refused", False)

    settings.GITHUB_API_URL = "http://127.0.0.1:1"
    client = forge_client("github")
    with pytest.raises(ForgeFailure) as down:
        client.default_branch(RepoRef("acme/web"), client.job_credential(RepoRef("acme/web")))
    assert (down.value.reason, down.value.transient) == ("forge-unreachable", True)


def test_an_empty_repository_has_no_default_branch_to_work_on(forges):
    forges.routes["/repos/acme/web"] = (200, {"default_branch": "main", "clone_url": f"{forges.url}/git/x.git"})
    forges.routes["/repos/acme/web/branches/main"] = (404, {"message": "Branch not found"})
    client = forge_client("github")
    with pytest.raises(ForgeFailure) as refused:
        client.default_branch(RepoRef("acme/web"), client.job_credential(RepoRef("acme/web")))
    assert refused.value.reason == "default-branch-missing" and not refused.value.transient


def test_no_token_configured_is_refused_without_a_request(forges, settings):
    settings.GITHUB_TOKEN = ""
    with pytest.raises(ForgeFailure) as refused:
        forge_client("github").job_credential(RepoRef("acme/web"))
    assert refused.value.reason == "forge-unconfigured" and forges.requests == []


# --- the other forges: their token, their API shapes, their git credential ------------------------------------

def test_gitlab_job_clones_with_its_token(tmp_path, forges):
    root = tmp_path / "remote"
    sha = make_repository(root, "group/sub/proj", FILES)
    forges.serve_git(root, basic("oauth2", "glpat-test"))
    forges.gitlab_project(42, "group/sub/proj", sha)
    spec = forge_spec("gl-clone", kind="gitlab", repo="group/sub/proj", project_id="42")

    dirs, workspace = prepare(tmp_path, spec)

    assert head_of(dirs.workspace) == sha
    assert workspace.credential.token == "glpat-test"
    api = [r for r in forges.requests if r["path"].startswith("/api/")]
    assert [r["path"] for r in api] == ["/api/v4/projects/42", "/api/v4/projects/42/repository/branches/main",
                                        "/api/v4/projects/42/fork", f"/api/v4/projects/{workspace.fork.project_id}"]
    assert all(r["headers"]["private-token"] == "glpat-test" for r in api)


def test_gitlab_unprotected_default_branch_is_refused(forges):
    forges.gitlab_project(42, "group/proj", "b" * 40, protected=False)
    client = forge_client("gitlab")
    ref = RepoRef("group/proj", project_id="42")
    assert client.default_branch(ref, client.job_credential(ref)).protected is False


def test_forgejo_job_clones_with_its_token(tmp_path, forges):
    root = tmp_path / "remote"
    sha = make_repository(root, "kostekIV/test", FILES)
    forges.serve_git(root, basic("pidispatch", "forgejo-test-token"))
    forges.forgejo_repository("kostekIV/test", sha)

    dirs, workspace = prepare(tmp_path, forge_spec("fj-clone", kind="forgejo", repo="kostekIV/test"))

    assert head_of(dirs.workspace) == sha
    assert workspace.credential.token == "forgejo-test-token"
    api = [r for r in forges.requests if r["path"].startswith("/api/")]
    assert [r["path"] for r in api] == ["/api/v1/repos/kostekIV/test", "/api/v1/repos/kostekIV/test/branches/main",
                                        "/api/v1/repos/kostekIV/test/forks", "/api/v1/repos/pidispatch-bot/test"]
    assert all(r["headers"]["authorization"] == "token forgejo-test-token" for r in api)


def test_azure_job_clones_with_its_pat_and_reads_branch_policies(tmp_path, forges):
    root = tmp_path / "remote"
    sha = make_repository(root, "widgets", FILES)
    forges.serve_git(root, basic("", "azure-pat"))
    forges.azure_repository(AZURE_PROJECT, AZURE_REPOSITORY, "widgets", sha)
    spec = forge_spec("az-clone", kind="azure", repo="Fabrikam/widgets", project_id=AZURE_PROJECT,
                      repository_id=AZURE_REPOSITORY)

    dirs, workspace = prepare(tmp_path, spec)

    assert head_of(dirs.workspace) == sha  # refs/heads/main, not its prefix-matched neighbour main-old
    assert workspace.credential.token == "azure-pat"
    refs = next(r for r in forges.requests if r["path"].endswith("/refs"))
    assert refs["query"] == {"filter": ["heads/main"], "api-version": ["7.1"]}
    policies = next(r for r in forges.requests if r["path"].endswith("/policy/configurations"))
    assert policies["query"]["repositoryId"] == [AZURE_REPOSITORY]
    assert policies["query"]["refName"] == ["refs/heads/main"]


def test_azure_without_a_blocking_policy_is_unprotected(forges):
    forges.azure_repository(AZURE_PROJECT, AZURE_REPOSITORY, "widgets", "c" * 40, blocking_policy=False)
    client = forge_client("azure")
    ref = RepoRef("Fabrikam/widgets", project_id=AZURE_PROJECT, repository_id=AZURE_REPOSITORY)
    assert client.default_branch(ref, client.job_credential(ref)).protected is False


# --- .pi/ ------------------------------------------------------------------------------------------------------

def test_pi_folder_is_materialised_from_the_commit_with_dot_files_links_and_exec_bits_dropped(tmp_path, forges,
                                                                                            remote):
    files = {**FILES, ".pi/.secret-notes": "no", ".pi/skills/.hidden/SKILL.md": "no",
             ".pi/skills/linked": ("symlink", "/etc"), ".pi/tools/run.sh": ("exec", "#!/bin/sh\n"),
             ".pi/skills/deep/a/b.md": "four levels\n"}
    sha = make_repository(remote, "acme/web", files)
    forges.github_repository("acme/web", sha)

    dirs, workspace = prepare(tmp_path, forge_spec("gh-pi"))

    pi = dirs.job / "pi"
    copied = sorted(str(path.relative_to(pi)) for path in pi.rglob("*") if path.is_file())
    assert copied == ["APPEND_SYSTEM.md", "skills/deep/a/b.md", "skills/fix-bug/SKILL.md", "tools/run.sh"]
    assert workspace.pi_files == 4
    assert (pi / "APPEND_SYSTEM.md").read_text() == "Be brief.\n"
    assert all(not os.access(path, os.X_OK) for path in pi.rglob("*") if path.is_file())
    assert not any(path.is_symlink() for path in pi.rglob("*"))


@pytest.mark.parametrize("files, reason", [
    ({f".pi/skills/s{i}/SKILL.md": "x" for i in range(257)}, "pi-too-many-files"),
    ({".pi/big.md": b"x" * (1024 * 1024 + 1)}, "pi-file-too-large"),
    ({f".pi/skills/s{i}.md": b"x" * (900 * 1024) for i in range(10)}, "pi-too-large"),
    ({".pi/a/b/c/d/e.md": "five levels"}, "pi-too-deep"),
])
def test_pi_folder_past_a_bound_is_refused_naming_the_bound(tmp_path, forges, remote, files, reason):
    sha = make_repository(remote, "acme/web", files)
    forges.github_repository("acme/web", sha)

    with pytest.raises(WorkspaceRefused) as refused:
        prepare(tmp_path, forge_spec(f"gh-{reason}"))

    assert refused.value.reason == reason


def test_pi_bounds_are_exact():
    def rows(count, size):
        return [("100644", "blob", f"{i:040x}", str(size), f".pi/f{i}") for i in range(count)]

    assert len(repo_skills.select(rows(256, 1))) == 256
    assert len(repo_skills.select(rows(1, repo_skills.MAX_FILE_BYTES))) == 1
    assert len(repo_skills.select(rows(8, repo_skills.MAX_FILE_BYTES))) == 8  # exactly 8 MiB
    assert len(repo_skills.select([("100644", "blob", "0" * 40, "1", ".pi/a/b/c/d.md")])) == 1
    with pytest.raises(WorkspaceRefused):
        repo_skills.select([("100644", "blob", "0" * 40, "1", ".pi/a/b/c/d/e.md")])
